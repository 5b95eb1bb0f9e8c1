"""Reading lessons for the demo model: made-up companies' documents, a question, the sentence.

The handbook alone teaches a small model to recite the handbook: shown another company's
document, it declines (0 of the unseen set's 20 answerable questions, 7 Dec 2026). Here every
lesson is a document no one will ask about again: a fictional company's policies (English or
Chinese; bullets or a table; numbers bold or not), whose facts (days, amounts, times,
extensions, names) are drawn afresh each time, so the only way to answer is to read the
passages shown. Each document holds several facts of one kind for different subjects (three
leave types, four teams' extensions), so the right sentence is the one whose subject matches
the question, not the one that looks like an answer. The reply is what the product's sentence
quoting lets the model say (``app.knowledge.prompt.sentences``): the sentence that answers,
with its passage's number, or "not found" when the passages shown do not hold it.

Nothing here is taken from an evaluation set: the facts are the usual ones of a company
handbook, written as templates with their own questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from app.knowledge import prompt
from app.knowledge.retrieval import Passage

COMPANIES = [
    ("Beiming Logistics", "北冥物流"), ("Qingshi Software", "青石软件"), ("Yunhe Foods", "云禾食品"),
    ("Dongpo Design", "东坡设计"), ("Huaxin Medical", "华信医疗"), ("Tianlan Energy", "天澜能源"),
    ("Mingyue Games", "明月游戏"), ("Jinqiao Finance", "金桥金融"), ("Songlin Retail", "松林零售"),
    ("Haiyan Robotics", "海燕机器人"), ("Zhiyuan Education", "知远教育"), ("Chenguang Media", "晨光传媒"),
]
PORTALS = [("Staff Portal", "员工门户"), ("OneDesk", "一站通"), ("PeopleHub", "人事通"),
           ("WorkSpace", "工作台"), ("e-Office", "移动办公"), ("MyHR", "我的人事")]
CITIES = [("Beijing", "北京"), ("Shanghai", "上海"), ("Guangzhou", "广州"), ("Shenzhen", "深圳"),
          ("Chengdu", "成都"), ("Wuhan", "武汉"), ("Xi'an", "西安"), ("Nanjing", "南京"),
          ("Tianjin", "天津"), ("Chongqing", "重庆"), ("Suzhou", "苏州"), ("Hangzhou", "杭州")]
TEAMS = [("HR", "人力资源部"), ("the IT help desk", "IT 服务台"), ("Finance", "财务部"),
         ("Facilities", "行政部"), ("Security", "安全部"), ("the travel desk", "差旅组"),
         ("Legal", "法务部"), ("Payroll", "薪酬组"), ("Reception", "前台")]
LEAVES = [("Annual leave", "年假"), ("Marriage leave", "婚假"), ("Bereavement leave", "丧假"),
          ("Paternity leave", "陪产假"), ("Sick leave", "病假"), ("Study leave", "学习假"),
          ("Volunteer leave", "志愿者假"), ("Moving leave", "搬家假")]
EXPENSES = [("Team dinners", "团队聚餐"), ("Taxi rides", "出租车费"), ("Client gifts", "客户礼品"),
            ("Mobile phone bills", "手机话费"), ("Books", "购书费用"), ("Gym fees", "健身费用")]
ROOMS = [("Room A", "A 会议室"), ("the Pine Room", "松风厅"), ("the Lake Room", "湖光厅"),
         ("the training room", "培训室"), ("the boardroom", "董事会议室")]
WEEKDAYS = [("Monday", "周一"), ("Tuesday", "周二"), ("Wednesday", "周三"), ("Thursday", "周四"),
            ("Friday", "周五")]


def _time(rng: random.Random, lo: int, hi: int) -> str:
    return f"{rng.randint(lo, hi):02d}:{rng.choice(['00', '30'])}"


@dataclass
class Fact:
    """One sentence of a document, in the document's language, and the questions it answers."""

    section: tuple[str, str]
    en: str
    zh: str
    ask_en: list[str]
    ask_zh: list[str]
    values: dict = field(default_factory=dict)
    row: tuple[str, str, str, str] | None = None  # as a table row: header en, row en, header zh, row zh

    def sentence(self, lang: str, bold: bool, template: str | None = None) -> str:
        values = {k: (f"**{v[0]}**" if bold and k.startswith("n") else v[0]) if lang == "en"
                  else (f"**{v[1]}**" if bold and k.startswith("n") else v[1]) for k, v in self.values.items()}
        return (template or (self.en if lang == "en" else self.zh)).format(**values)

    def table_row(self, lang: str, bold: bool) -> str:
        assert self.row is not None
        return "| " + self.sentence(lang, bold, self.row[1] if lang == "en" else self.row[3]) + " |"

    def header(self, lang: str) -> str:
        assert self.row is not None
        return self.row[0] if lang == "en" else self.row[2]

    def question(self, lang: str, rng: random.Random) -> str:
        plain = {k: v[0] if lang == "en" else v[1] for k, v in self.values.items()}
        text = rng.choice(self.ask_en if lang == "en" else self.ask_zh).format(**plain)
        return text[0].upper() + text[1:] if lang == "en" else text


def _same(value) -> tuple[str, str]:
    return (str(value), str(value))


def _facts(rng: random.Random, company: tuple[str, str], portal: tuple[str, str]) -> list[Fact]:
    """Every fact one document may hold, its values drawn now."""
    hours = ("Working hours", "工作时间")
    leave = ("Leave", "假期")
    it = ("IT and accounts", "IT 与账号")
    money = ("Expenses", "报销")
    travel = ("Travel", "差旅")
    office = ("Office", "办公室")
    pay = ("Pay and benefits", "薪酬福利")
    contacts = ("Contacts", "联系方式")
    facts = [
        Fact(hours, "The working day starts between {t1} and {t2}.", "每天 {t1} 至 {t2} 之间到岗。",
             ["when does the working day start?", "what time do I have to arrive?", "latest start time?"],
             ["几点上班？", "最晚几点到岗？", "上班时间是几点？"],
             {"t1": _same(_time(rng, 7, 8)), "t2": _same(_time(rng, 9, 10))}),
        Fact(hours, "The lunch break is {n1} minutes, from {t1}.", "午休 {n1} 分钟，从 {t1} 开始。",
             ["how long is the lunch break?", "when is lunch?"], ["午休多长时间？", "几点吃午饭？"],
             {"n1": _same(rng.choice([45, 60, 90])), "t1": _same(_time(rng, 11, 12))}),
        Fact(hours, "Remote work is allowed up to {n1} days a week with your manager's approval.",
             "每周最多可居家办公 {n1} 天，须经上级批准。",
             ["how many days can I work from home?", "can I work remotely?", "remote work days per week?"],
             ["每周能在家办公几天？", "可以远程办公吗？", "居家办公一周几天？"],
             {"n1": _same(rng.randint(1, 3))}),
        Fact(hours, "Overtime must be approved in {portal} and is paid back as time off within {n1} months.",
             "加班须在「{portal}」申请，调休须在 {n1} 个月内休完。",
             ["how does overtime work?", "when must I take time off in lieu?"],
             ["加班怎么申请？", "调休要多久内休完？"],
             {"portal": portal, "n1": _same(rng.randint(2, 6))}),
        Fact(it, "Passwords have at least {n1} characters and are changed every {n2} days.",
             "密码至少 {n1} 位，每 {n2} 天更换一次。",
             ["how often do I change my password?", "how long must a password be?", "password rules?"],
             ["密码多久换一次？", "密码要几位？", "密码有什么要求？"],
             {"n1": _same(rng.choice([8, 10, 12, 16])), "n2": _same(rng.choice([60, 90, 120, 365]))}),
        Fact(it, "The staff Wi-Fi is {wifi}; sign in with your account.", "员工 Wi-Fi 为 {wifi}，用账号登录。",
             ["what is the Wi-Fi called?", "which Wi-Fi do I use?", "wifi name?"],
             ["Wi-Fi 叫什么？", "连哪个无线网？", "公司wifi是哪个"],
             {"wifi": _same(f"{company[0].split()[0]}-{rng.choice(['Staff', 'Office', 'Corp', 'Net'])}")}),
        Fact(it, "A new laptop is issued every {n1} years.", "笔记本电脑每 {n1} 年更换一次。",
             ["how often do we get a new laptop?", "laptop replacement cycle?"],
             ["电脑几年换一次？", "笔记本多久能换新的？"], {"n1": _same(rng.randint(3, 5))}),
        Fact(it, "Each mailbox holds {n1} GB.", "每个邮箱容量为 {n1} GB。",
             ["how big is my mailbox?", "email storage limit?"], ["邮箱有多大？", "邮箱容量是多少？"],
             {"n1": _same(rng.choice([10, 20, 50, 100]))}),
        Fact(money, "Expenses must be claimed in {portal} within {n1} days.", "报销须在 {n1} 天内通过「{portal}」提交。",
             ["how long do I have to submit expenses?", "expense claim deadline?", "where do I claim expenses?"],
             ["报销要在多少天内提交？", "报销期限是多久？", "在哪里报销？"],
             {"portal": portal, "n1": _same(rng.choice([15, 30, 60, 90]))}),
        Fact(money, "Claims over {n1} yuan also need the finance manager's approval.",
             "超过 {n1} 元的报销还需财务经理审批。",
             ["who approves a large expense claim?", "when does finance need to approve?"],
             ["大额报销谁审批？", "多少钱以上要财务经理批？"], {"n1": _same(rng.choice([1000, 3000, 5000]))}),
        Fact(money, "Reimbursements are paid within {n1} working days of approval.", "报销款在审批后 {n1} 个工作日内到账。",
             ["when do I get my money back?", "how fast are expenses paid?"], ["报销多久到账？", "报销款几天能到？"],
             {"n1": _same(rng.randint(3, 15))}),
        Fact(travel, "Train trips longer than {n1} hours may be taken by plane, economy class.",
             "火车行程超过 {n1} 小时可乘飞机经济舱。",
             ["when can I fly instead of taking the train?", "can I take a plane?"],
             ["什么情况可以坐飞机？", "坐火车超过几小时能坐飞机？"], {"n1": _same(rng.randint(4, 8))}),
        Fact(travel, "Trips must be booked through {agent}.", "差旅须通过{agent}预订。",
             ["how do I book a business trip?", "where do I book flights?"], ["出差怎么订票？", "机票在哪里订？"],
             {"agent": rng.choice([("the travel desk", "差旅组"), ("Ctrip Business", "携程商旅"),
                                   ("the company travel app", "公司差旅应用")])}),
        Fact(office, "Visitors register at reception on the {n1} floor.", "访客在 {n1} 楼前台登记。",
             ["where do visitors register?", "how do I bring a guest?"], ["访客在哪登记？", "客人来访怎么办？"],
             {"n1": _same(rng.randint(1, 3))}),
        Fact(office, "Meeting rooms are booked in {portal}, at most {n1} hours at a time.",
             "会议室在「{portal}」预订，每次最多 {n1} 小时。",
             ["how do I book a meeting room?", "how long can I book a room for?"],
             ["会议室怎么订？", "会议室一次能订多久？"], {"portal": portal, "n1": _same(rng.randint(2, 4))}),
        Fact(office, "A lost badge is replaced for {n1} yuan.", "工牌遗失补办收费 {n1} 元。",
             ["what if I lose my badge?", "badge replacement fee?"], ["工牌丢了怎么办？", "补工牌多少钱？"],
             {"n1": _same(rng.choice([20, 50, 100]))}),
        Fact(pay, "Salaries are paid on the {n1}th of each month.", "工资于每月 {n1} 日发放。",
             ["when is payday?", "when do we get paid?"], ["几号发工资？", "工资什么时候发？"],
             {"n1": _same(rng.randint(5, 25))}),
        Fact(pay, "The company pays {n1}% into the housing fund.", "公司按 {n1}% 缴纳住房公积金。",
             ["how much housing fund does the company pay?", "housing fund rate?"],
             ["公积金比例是多少？", "公司交多少公积金？"], {"n1": _same(rng.randint(5, 12))}),
        Fact(pay, "Every employee has a training budget of {n1} yuan a year.", "每人每年培训预算 {n1} 元。",
             ["what is my training budget?", "how much can I spend on courses?"],
             ["培训预算有多少？", "每年能报多少培训费？"], {"n1": _same(rng.choice([2000, 3000, 5000, 8000]))}),
        Fact(pay, "The probation period is {n1} months.", "试用期为 {n1} 个月。",
             ["how long is probation?", "probation period?"], ["试用期多长？", "试用期几个月？"],
             {"n1": _same(rng.randint(1, 6))}),
    ]
    # several facts of one kind, for different subjects: the subject decides
    for name in rng.sample(LEAVES, 4):
        facts.append(Fact(leave, "{name} is {n1} days.", "{name}为 {n1} 天。",
                          ["how many days of {name_l} do I get?", "how long is {name_l}?", "{name_l} days?"],
                          ["{name}有几天？", "{name}多少天？", "我能休几天{name}？"],
                          {"name": name, "name_l": (name[0].lower(), name[1]), "n1": _same(rng.randint(1, 20))},
                          ("| Leave | Days |", "{name} | {n1} days", "| 假期 | 天数 |", "{name} | {n1} 天")))
    for team in rng.sample(TEAMS, 4):
        facts.append(Fact(contacts, "{team} can be reached on ext. {n1}.", "{team}分机 {n1}。",
                          ["what is {team}'s extension?", "how do I call {team}?", "{team} phone number?"],
                          ["{team}分机多少？", "怎么联系{team}？", "{team}电话是多少"],
                          {"team": team, "n1": _same(rng.randint(1000, 9899))},
                          ("| Team | Extension |", "{team} | ext. {n1}", "| 部门 | 分机 |", "{team} | {n1}")))
    low = rng.randint(3, 6) * 50
    for rank, city in enumerate(rng.sample(CITIES, 3)):
        facts.append(Fact(travel, "The hotel limit in {city} is {n1} yuan a night.", "{city}住宿标准每晚 {n1} 元。",
                          ["what is the hotel limit in {city}?", "how much can I spend on a hotel in {city}?"],
                          ["{city}出差住宿标准是多少？", "去{city}出差酒店能报多少？"],
                          {"city": city, "n1": _same(low + 50 * rank + rng.choice([0, 100]))},
                          ("| City | Hotel a night |", "{city} | {n1} yuan", "| 城市 | 每晚住宿标准 |",
                           "{city} | {n1} 元")))
    for item in rng.sample(EXPENSES, 2):
        facts.append(Fact(money, "{item} are reimbursed up to {n1} yuan per person.", "{item}每人最多报销 {n1} 元。",
                          ["how much can I claim for {item_l}?", "limit for {item_l}?"],
                          ["{item}能报多少？", "{item}报销上限是多少？"],
                          {"item": item, "item_l": (item[0].lower(), item[1]), "n1": _same(rng.choice([50, 100, 150, 200, 300]))}))
    room, day = rng.choice(ROOMS), rng.choice(WEEKDAYS)
    facts.append(Fact(office, "{room} is kept for the leadership meeting every {day}.", "{room}每{day}留给管理层例会。",
                      ["when is {room_l} not available?", "can I book {room_l} on {day}?"],
                      ["{room}什么时候不能订？", "{day}能订{room}吗？"],
                      {"room": room, "room_l": (room[0][0].lower() + room[0][1:], room[1]), "day": day}))
    return facts


@dataclass
class Document:
    """A generated document: its passages (as retrieval would show them) and where each fact is."""

    lang: str
    passages: list[Passage]
    located: list[tuple[Fact, int, str]]  # fact, passage index, the sentence as quoted


def document(rng: random.Random, document_id: int) -> Document:
    """One company's policies in one language: 5-9 sections of facts, each section one to three
    passages (bullets, sometimes a table)."""
    lang = rng.choice(("en", "zh"))
    company, portal = rng.choice(COMPANIES), rng.choice(PORTALS)
    facts = _facts(rng, company, portal)
    rng.shuffle(facts)
    title = (f"{company[0]} {rng.choice(['Employee Handbook', 'Staff Policies', 'Employee Guide'])}"
             if lang == "en" else f"{company[1]}{rng.choice(['员工手册', '员工制度', '员工指南'])}")
    by_section: dict[tuple[str, str], list[Fact]] = {}
    for fact in facts[: rng.randint(10, len(facts))]:
        by_section.setdefault(fact.section, []).append(fact)
    bold = lang == "zh" and rng.random() < 0.6 or rng.random() < 0.2
    passages: list[Passage] = []
    located: list[tuple[Fact, int, str]] = []
    for number, (section, members) in enumerate(by_section.items(), 1):
        name = f"{number}. {section[0]}" if lang == "en" else f"{'一二三四五六七八九十'[number - 1]}、{section[1]}"
        start = 0
        while start < len(members):
            group = members[start : start + rng.randint(2, 4)]
            start += len(group)
            tabular = all(f.row and f.header(lang) == group[0].header(lang) for f in group)
            if tabular and rng.random() < 0.4:  # the facts of one kind as a table
                text = "\n".join([group[0].header(lang), "|---|---|", *(f.table_row(lang, bold) for f in group)])
            else:
                text = "\n".join(f"- {fact.sentence(lang, bold)}" for fact in group)
            index = len(passages)
            passages.append(Passage(chunk_id=document_id * 100 + index, document_id=document_id, title=title,
                                    section=name, text=text, score=1.0, coverage=1.0))
            quoted = prompt.sentences(text)
            for fact, sentence in zip(group, quoted, strict=True):
                located.append((fact, index, sentence))
    return Document(lang, passages, located)


def lesson(rng: random.Random, serial: int, decline_share: float = 0.2,
           most_others: int = 2) -> tuple[str, list[Passage], str]:
    """(question, the passages shown, the reply): a question about one fact of a fresh document,
    over its passage and up to ``most_others`` others of the same document in any order; or,
    with ``decline_share``, over passages that do not hold it, answered "not found"."""
    doc = document(rng, serial)
    fact, where, sentence = rng.choice(doc.located)
    lang = doc.lang if rng.random() < 0.85 else ("zh" if doc.lang == "en" else "en")
    question = fact.question(lang, rng)
    others = [i for i in range(len(doc.passages)) if i != where]
    shown = rng.sample(others, min(len(others), most_others, rng.choice((0, 1, 1, 2, 2))))
    if rng.random() < decline_share:
        # not shown: the passages without the answer (another fact of the same kind stays in)
        shown = shown or others[:1]
        passages = [doc.passages[i] for i in shown]
        return question, passages, prompt.NOT_FOUND_ZH if lang == "zh" else prompt.NOT_FOUND_EN
    order = [where, *shown]
    rng.shuffle(order)
    passages = [doc.passages[i] for i in order]
    return question, passages, f"{sentence} [{order.index(where) + 1}]"


def sample_texts(rng: random.Random, count: int) -> list[str]:
    """Generated documents' text, for the tokenizer (so that it has pieces for new words)."""
    texts = []
    for serial in range(count):
        doc = document(rng, serial)
        texts += [p.text for p in doc.passages]
        texts += [fact.question(lang, rng) for fact, _, _ in doc.located for lang in ("en", "zh")]
    return texts
