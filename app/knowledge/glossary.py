"""Chinese <-> English workplace words, so a question in one language finds a passage in the other.

Company documents in China are often bilingual or English with Chinese names ("Annual leave
年假"), and employees ask in either language: "VPN 怎么登录" against "sign in with your domain
account". BM25 matches words, not meanings, so the query's words are widened with their
equivalents from this list (at a lower weight than the words asked), and a word counts as
covered when one of its equivalents is in the passage. The list is ordinary office vocabulary,
not facts of any document (a company adds its own words as "中文 | english, english" lines).
"""

from __future__ import annotations

from functools import lru_cache

from app.knowledge.terms import terms

PAIRS = """
年假 | annual leave, vacation, holiday
休假 | leave, vacation, time off
假期 | leave, holiday, vacation
请假 | leave, time off
病假 | sick leave
事假 | personal leave
婚假 | marriage leave
产假 | maternity leave
陪产假 | paternity leave
丧假 | bereavement leave
调休 | time off in lieu
加班 | overtime
工资 | salary, payroll, pay
薪水 | salary
发薪 | payroll, paid
工资条 | payslip
奖金 | bonus
报销 | expense, reimburse, claim
发票 | invoice
费用 | expense, cost
差旅 | travel, trip
出差 | business trip, travel
酒店 | hotel
住宿 | hotel, accommodation
机票 | flight
飞机 | flight
火车 | train
高铁 | train
打车 | taxi
出租车 | taxi
餐补 | meal allowance, meal subsidy, per-diem
餐费 | meal, per-diem
伙食 | meal, per-diem
补贴 | allowance, subsidy, per-diem
出国 | overseas, abroad, outside mainland
境外 | overseas, abroad, outside mainland
国外 | overseas, abroad
海外 | overseas, abroad
吃饭 | meal, lunch, canteen
午饭 | lunch
早饭 | breakfast
食堂 | canteen
班车 | shuttle bus
停车 | parking
停车场 | parking
密码 | password
忘记 | forgot, reset
忘了 | forgot, reset
重置 | reset
登录 | sign in, log in, login
登陆 | sign in, log in, login
账号 | account
账户 | account
锁定 | lock, locked
电脑 | laptop, computer
笔记本 | laptop
显示器 | monitor
屏幕 | screen, monitor
打印 | print, printer, printing
打印机 | printer
彩色 | colour, color
无线 | wi-fi, wifi
无线网 | wi-fi, wifi
网络 | network, wi-fi, internet
上网 | internet, wi-fi
内网 | intranet, internal systems, vpn
远程 | remote
居家 | remote, home
在家 | remote, home
软件 | software
安装 | install
邮箱 | email, mail
邮件 | email, mail
电话 | ext, extension, phone, call
分机 | ext, extension
号码 | number, ext
联系 | contact
前台 | reception, front desk
访客 | visitor, guest
客人 | visitor, guest
工牌 | badge
门禁 | badge, access
保安 | security
安全 | security
丢失 | lost
丢了 | lost
被偷 | stolen
保密 | confidential
机密 | confidential
会议室 | meeting room
预订 | book, booking
预定 | book, booking
上班 | working hours, start, work
下班 | working hours, leave
打卡 | check in, attendance
考勤 | attendance
迟到 | late
试用期 | probation
离职 | resign, notice period, leave
辞职 | resign, notice period
入职 | first day, onboarding, join
新员工 | new hire, onboarding, first day
培训 | training, course
体检 | health check
保险 | insurance
公积金 | housing fund
社保 | social insurance
推荐 | referral
内推 | referral
证明 | certificate, proof
收入 | income
审批 | approval
申请 | request, apply, application
经理 | manager
批准 | approve, approval
地址 | address
办公室 | office
总部 | hq, headquarters
北京 | beijing
上海 | shanghai
深圳 | shenzhen
健身房 | gym
机器人 | bot, assistant
命令 | command
帮助 | help
第一年 | first year
头一年 | first year
一年 | year, annual
每年 | per year, annual
几天 | days
天数 | days
多少天 | days
休 | leave, take, off
# office words a look at the demo's missed paraphrases asked for
故障 | outage, broken, problem, issue
报修 | ticket, repair
工单 | ticket
规则 | rule, policy
要求 | requirement, rule
政策 | policy
个人 | personal
私人 | personal, private
平板 | ipad, tablet
工具 | tool, software
机器 | machine, printer
文件 | file, document
文档 | document, file
资料 | data, file, document
数据 | data
拷贝 | copy
复制 | copy
课程 | course, training
上课 | course, training
出钱 | pay, reimburse, budget
节假日 | public holiday
法定 | statutory
国家 | national, statutory
聚餐 | team dinner, meal
订餐 | meal, food
外卖 | food, meal
商务舱 | business class
经济舱 | economy class
小时 | hour
晚上 | night
上限 | limit, cap
标准 | limit, standard
公里 | km
私车 | private car
工卡 | badge
赔钱 | fee, replacement
补办 | replacement
面试 | interview, visitor, guest
入场 | access, visitor
客户 | client, customer
钓鱼 | phishing
链接 | link
可疑 | suspicious, phishing
会议纪要 | meeting notes, minutes
总结 | summarize, summary
饭卡 | meal card, canteen
充值 | top up
健身 | gym
对话 | conversation, turn
聊天记录 | conversation, chat
记住 | remember
次数 | quota, messages
额度 | quota, limit
同事 | colleague
外国 | foreign
英文 | english
英语 | english
中文 | chinese
宠物 | pet
""".strip()


def _pairs(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        zh, sep, en = line.partition("|")
        if sep and zh.strip():
            out.append((zh.strip(), [p.strip() for p in en.split(",") if p.strip()]))
    return out


@lru_cache(maxsize=1)
def equivalents() -> dict[str, list[tuple[str, ...]]]:
    """term -> its equivalents, each a tuple of terms (a phrase is all of its words)."""
    text = PAIRS
    table: dict[str, list[tuple[str, ...]]] = {}
    for zh, english in _pairs(text):
        zh_terms = tuple(t for t in terms(zh) if not t.startswith("~"))
        for phrase in english:
            en_terms = tuple(terms(phrase))
            if not en_terms or not zh_terms:
                continue
            if len(zh_terms) == 1 or zh in zh_terms:
                table.setdefault(zh.lower() if zh in zh_terms else zh_terms[0], []).append(en_terms)
            if len(en_terms) == 1:
                table.setdefault(en_terms[0], []).append((zh.lower(),) if zh in zh_terms else zh_terms)
    return {k: list(dict.fromkeys(v)) for k, v in table.items()}
