// The emulator's chat page: play one employee, talk to the bot, watch its replies arrive.
// Everything goes through the emulator's own admin API; text is always set with textContent.
(function () {
  "use strict";
  var select = document.getElementById("user-select");
  var list = document.getElementById("user-list");
  var box = document.getElementById("messages");
  var input = document.getElementById("input");
  var statusLine = document.getElementById("status");
  var channel = document.getElementById("channel");
  var userid = null, lastSeq = 0, shown = {}, timer = null, generation = 0;
  var NAMES = {};
  Array.prototype.forEach.call(select.options, function (o) { NAMES[o.value] = o.textContent; });

  function setStatus(text) { statusLine.textContent = text || ""; }

  function postJSON(url, body) {
    return fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
                        body: JSON.stringify(body || {}) })
      .then(function (r) { return r.json().then(function (j) { if (!r.ok) throw new Error(j.error || r.status); return j; }); });
  }

  function describe(item) {
    if (item.direction === "in") {
      if (item.msg_type === "event") return "［事件］" + item.event + (item.event_key ? " · " + item.event_key : "");
      if (item.msg_type === "text") return item.content;
      return "［" + item.msg_type + "］";
    }
    if (item.content) return item.content;
    var p = item.payload || {};
    return "［" + item.msgtype + "］" + (p.title || p.description || "");
  }

  // A template card (button_interaction): its buttons post the template_card_event callback;
  // once the app calls update_template_card they are replaced by its text, not clickable.
  function renderCard(bubble, item) {
    var p = item.payload || {};
    bubble.textContent = "";
    bubble.classList.add("card");
    var title = document.createElement("div");
    title.className = "card-title";
    title.textContent = (p.main_title && p.main_title.title) || "";
    bubble.appendChild(title);
    if (p.main_title && p.main_title.desc) {
      var desc = document.createElement("div");
      desc.className = "muted small";
      desc.textContent = p.main_title.desc;
      bubble.appendChild(desc);
    }
    // button_selection: WeCom's drop-down, its choice sent with the button's click (SelectedItems)
    var choice = null, sel = p.button_selection;
    if (sel && sel.option_list && sel.option_list.length) {
      var line = document.createElement("label");
      line.className = "card-reasons";
      line.textContent = sel.title || "";
      choice = document.createElement("select");
      choice.className = "card-select";
      sel.option_list.forEach(function (o) {
        var option = document.createElement("option");
        option.value = o.id;
        option.textContent = o.text;
        choice.appendChild(option);
      });
      choice.value = sel.selected_id || sel.option_list[0].id;
      line.appendChild(choice);
      bubble.appendChild(line);
    }
    var row = document.createElement("div");
    row.className = "card-buttons";
    (p.button_list || []).forEach(function (b) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = "card-button";
      button.setAttribute("data-key", b.key || "");
      button.textContent = b.text || b.key;
      button.addEventListener("click", function () {
        Array.prototype.forEach.call(row.querySelectorAll("button"), function (x) { x.disabled = true; });
        var click = { userid: item.touser, task_id: p.task_id, key: b.key };
        if (choice) { click.selected = {}; click.selected[sel.question_key] = choice.value; choice.disabled = true; }
        postJSON("/_emulator/card_click", click)
          .then(poll)
          .catch(function (e) { setStatus("点击失败：" + e.message); });
      });
      row.appendChild(button);
    });
    bubble.appendChild(row);
  }

  function updateCard(node, item) {
    var u = item.card_update;
    if (!u || node.getAttribute("data-updated")) return;
    node.setAttribute("data-updated", "1");
    var row = node.querySelector(".card-buttons");
    if (!row) return;
    row.textContent = "";
    var done = document.createElement("span");
    done.className = "card-done";
    done.textContent = u.replace_name || "已更新";
    row.appendChild(done);
  }

  // An AI bot reply whose first stream reply carried feedback.id: WeCom's 👍/👎 under it (and a
  // withdrawal once rated), each posting the feedback_event through the emulator.
  function renderThumbs(bubble, item) {
    var row = document.createElement("div");
    row.className = "card-buttons thumbs";
    function rate(type, label) {
      Array.prototype.forEach.call(row.querySelectorAll("button"), function (x) { x.disabled = true; });
      postJSON("/_emulator/aibot/feedback", { delivery_id: item.delivery_id, type: type })
        .then(function () { show(type === 3 ? null : label); })
        .catch(function (e) { setStatus("评价失败：" + e.message); show(null); });
    }
    function button(text, type, cls) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "card-button " + cls;
      b.textContent = text;
      b.addEventListener("click", function () { rate(type, text); });
      return b;
    }
    function show(rated) {
      row.textContent = "";
      if (rated) {
        var done = document.createElement("span");
        done.className = "card-done";
        done.textContent = "已评价：" + rated;
        row.appendChild(done);
        row.appendChild(button("撤销", 3, "thumb-withdraw"));
      } else {
        row.appendChild(button("👍", 1, "thumb-up"));
        row.appendChild(button("👎", 2, "thumb-down"));
      }
    }
    show(null);
    bubble.appendChild(row);
  }

  // WeCom's markdown, drawn as its client draws it (the rules of emulator/rendering.py): the app's
  // markdown message knows headings, bold, links, inline code, quotes and three font colours;
  // the AI bot's stream also lists, italics, strikes and code blocks. Built from DOM nodes,
  // text always by textContent; a link only for http(s).
  var INLINE = /\*\*(?=\S)([^\n]+?)(?<=\S)\*\*|`([^`\n]+)`|\[([^\]\n]+)\]\(([^)\s]+)\)|<font\s+color=["']?(\w+)["']?\s*>([\s\S]*?)<\/font>/g;
  var EMPHASIS = /(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])|~~(?=\S)([^\n]+?)(?<=\S)~~/g;
  var COLORS = ["info", "comment", "warning"];

  function el(tag, cls) { var n = document.createElement(tag); if (cls) n.className = cls; return n; }

  function appendPlain(parent, text, stream) {
    if (!stream) { parent.appendChild(document.createTextNode(text)); return; }
    var re = new RegExp(EMPHASIS.source, "g"), last = 0, m;
    while ((m = re.exec(text))) {
      parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      var node = el(m[1] !== undefined ? "i" : "s");
      node.textContent = m[1] !== undefined ? m[1] : m[2];
      parent.appendChild(node);
      last = re.lastIndex;
    }
    parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function appendInline(parent, text, stream) {
    var re = new RegExp(INLINE.source, "g"), last = 0, m, node;
    while ((m = re.exec(text))) {
      appendPlain(parent, text.slice(last, m.index), stream);
      if (m[1] !== undefined) {
        node = el("b"); appendInline(node, m[1], stream); parent.appendChild(node);
      } else if (m[2] !== undefined) {
        node = el("code"); node.textContent = m[2]; parent.appendChild(node);
      } else if (m[3] !== undefined) {
        node = el("a"); node.textContent = m[3];
        if (/^https?:\/\//i.test(m[4])) { node.href = m[4]; node.target = "_blank"; node.rel = "noopener noreferrer"; }
        parent.appendChild(node);
      } else if (COLORS.indexOf(m[5].toLowerCase()) >= 0) {
        node = el("span", "md-font-" + m[5].toLowerCase()); appendInline(node, m[6], stream); parent.appendChild(node);
      } else {
        appendPlain(parent, m[0], stream);
      }
      last = re.lastIndex;
    }
    appendPlain(parent, text.slice(last), stream);
  }

  function renderMarkup(bubble, content, stream) {
    var box = el("div", "md"), pre = null;
    (content || "").replace(/\r\n/g, "\n").split("\n").forEach(function (line) {
      if (stream && /^\s*(```|~~~)/.test(line)) { pre = pre ? null : box.appendChild(el("pre")); return; }
      if (pre) { pre.textContent += (pre.textContent ? "\n" : "") + line; return; }
      var m, row = el("div", "md-line");
      if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) { row.className += " md-h" + m[1].length; line = m[2]; }
      else if ((m = /^\s*>\s?(.*)$/.exec(line))) { row.className += " md-quote"; line = m[1]; }
      else if (stream && (m = /^(\s*)[-*+]\s+(.*)$/.exec(line))) { line = m[1] + "• " + m[2]; }
      appendInline(row, line, stream);
      box.appendChild(row);
    });
    bubble.appendChild(box);
  }

  function isStream(item) {
    return item.msgtype === "stream" || item.source === "aibot_stream" || item.source === "aibot_ws";
  }

  function deliveryText(d) {
    if (!d) return "";
    if (d.status === "pending") return "投递中…";
    if (d.status === "failed") return "投递失败（" + d.attempts + " 次尝试）";
    return d.attempts > 1 ? "已送达（" + d.attempts + " 次尝试）" : "已送达";
  }

  function render(item, deliveries) {
    var key = item.direction + ":" + item.seq;
    var node = shown[key];
    if (!node) {
      node = document.createElement("div");
      var isEvent = item.direction === "in" && item.msg_type === "event";
      node.className = "msg " + (isEvent ? "event" : item.direction);
      var bubble = document.createElement("div");
      bubble.className = "bubble";
      bubble.textContent = describe(item);
      if (item.direction === "out" && item.content != null && (item.msgtype === "markdown" || isStream(item))) {
        bubble.textContent = "";
        renderMarkup(bubble, item.content, isStream(item));
      }
      if (item.msgtype === "template_card") renderCard(bubble, item);
      if (item.direction === "out" && item.feedback_id && item.delivery_id) renderThumbs(bubble, item);
      var meta = document.createElement("span");
      meta.className = "meta";
      bubble.appendChild(meta);
      node.appendChild(bubble);
      box.appendChild(node);
      shown[key] = node;
      box.scrollTop = box.scrollHeight;
      if (item.direction === "out" && /^aibot/.test(item.source || "")) setStatus("");
    }
    if (item.msgtype === "template_card") updateCard(node, item);
    var metaNode = node.querySelector(".meta");
    var time = new Date(item.time * 1000).toLocaleTimeString("zh-CN", { hour12: false });
    var extra = item.direction === "in" ? deliveryText(deliveries[item.delivery_id]) :
      (item.msgtype === "markdown" ? "markdown" : "") + (item.source === "passive_reply" ? " 被动回复" : "");
    if (item.channel === "aibot" || item.channel === "aibot_ws") extra = item.channel === "aibot" ? "智能机器人 · 回调" : "智能机器人 · 长连接";
    if (item.source === "aibot_stream") extra = "智能机器人 · 回调";
    if (item.source === "aibot_ws" || item.source === "aibot_ws_welcome") extra = "智能机器人 · 长连接";
    metaNode.textContent = time + (extra ? " · " + extra : "");
    metaNode.className = "meta" + (/失败/.test(extra) ? " failed" : "");
  }

  function poll() {
    if (!userid) return;
    var mine = generation;
    // Re-read from 0 while deliveries are pending so their status updates; cheap for one user.
    fetch("/_emulator/conversation?userid=" + encodeURIComponent(userid) + "&since=0")
      .then(function (r) { return r.json(); })
      .then(function (data) {
        if (mine !== generation) return;
        data.items.forEach(function (item) { render(item, data.deliveries || {}); });
        lastSeq = data.last_seq;
      })
      .catch(function () { setStatus("无法连接模拟器"); });
  }

  function choose(id) {
    userid = id; lastSeq = 0; shown = {}; generation += 1;
    box.textContent = "";
    select.value = id;
    Array.prototype.forEach.call(list.children, function (li) {
      li.classList.toggle("active", li.getAttribute("data-userid") === id);
    });
    document.getElementById("chat-user").textContent = NAMES[id] || id;
    try { localStorage.setItem("emulator-user", id); } catch (e) { /* private mode */ }
    poll();
  }

  function send(body) {
    setStatus("");
    var url = "/_emulator/send";
    if (channel && channel.value !== "app") {  // the AI bot: by callback, or over the long connection
      url = "/_emulator/aibot/send";
      var kind = body.msg_type || "text";
      var content = body.content;
      if (kind === "voice") {  // WeCom gives the bot the transcript: the input box's text, or a sample
        content = input.value.trim() || "年假有几天？";
        input.value = "";
      }
      body = { from_user: body.from_user, msg_type: kind, content: content,
               mode: channel.value === "aibot_ws" ? "ws" : "callback" };
    }
    return postJSON(url, body).then(function () {
      if (url !== "/_emulator/send") setStatus("智能机器人回答中…（流式消息结束后显示）");
      poll();
    }).catch(function (e) { setStatus("发送失败：" + e.message); });
  }

  select.addEventListener("change", function () { choose(select.value); });
  list.addEventListener("click", function (ev) {
    var li = ev.target.closest("li[data-userid]");
    if (li) choose(li.getAttribute("data-userid"));
  });
  document.getElementById("composer").addEventListener("submit", function (ev) {
    ev.preventDefault();
    var text = input.value;
    if (!text.trim() || !userid) return;
    input.value = "";
    send({ from_user: userid, msg_type: "text", content: text });
  });
  input.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      document.getElementById("composer").requestSubmit();
    }
  });
  Array.prototype.forEach.call(document.querySelectorAll(".send-media"), function (button) {
    // the emulator's own media (media/get serves it): voice, image or file
    button.addEventListener("click", function () {
      if (userid) send({ from_user: userid, msg_type: button.getAttribute("data-kind") });
    });
  });
  document.getElementById("enter-agent").addEventListener("click", function () {
    if (!userid) return;
    if (channel && channel.value === "aibot_ws") {
      postJSON("/_emulator/aibot/enter_chat", { from_user: userid }).then(poll)
        .catch(function (e) { setStatus("发送失败：" + e.message); });
    } else if (!channel || channel.value === "app") {
      send({ from_user: userid, event: "enter_agent", event_key: "" });
    }
  });
  document.getElementById("verify").addEventListener("click", function () {
    setStatus("正在校验回调 URL…");
    postJSON("/_emulator/verify").then(function (r) {
      setStatus(r.ok ? "URL 校验通过（" + r.latency_ms + " ms）" :
        "URL 校验失败：HTTP " + (r.status_code || "-") + (r.error ? " " + r.error : "") + (r.echoed ? "" : "，未回显 echostr"));
    }).catch(function (e) { setStatus("校验失败：" + e.message); });
  });

  var saved = null;
  try { saved = localStorage.getItem("emulator-user"); } catch (e) { /* private mode */ }
  choose(saved && NAMES[saved] ? saved : select.value);
  timer = setInterval(poll, 1000);
})();
