// Draws the dashboard's charts from the inline JSON the server rendered (no extra request).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("chart-data").textContent);
  var charts = [];

  function draw(id, option) {
    var node = document.getElementById(id);
    if (!node || typeof echarts === "undefined") { return; }
    var chart = echarts.init(node);
    chart.setOption(option);
    charts.push(chart);
  }

  function pie(items) {
    return {
      tooltip: { trigger: "item", valueFormatter: function (v) { return v.toFixed(4); } },
      series: [{ type: "pie", radius: ["35%", "70%"], data: items }]
    };
  }

  draw("chart-daily", {
    tooltip: { trigger: "axis" },
    legend: { data: ["cost", "calls"] },
    xAxis: { type: "category", data: data.days },
    yAxis: [{ type: "value", name: "cost" }, { type: "value", name: "calls" }],
    series: [
      { name: "cost", type: "line", smooth: true, areaStyle: {}, data: data.daily_cost },
      { name: "calls", type: "bar", yAxisIndex: 1, data: data.daily_calls }
    ]
  });
  draw("chart-departments", pie(data.departments));
  draw("chart-models", pie(data.models));

  window.addEventListener("resize", function () {
    charts.forEach(function (chart) { chart.resize(); });
  });
})();
