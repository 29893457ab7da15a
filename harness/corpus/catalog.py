"""The business-domain catalogue the generator draws from: intents, their constraints and phrasings.

Each domain has a few intents; each intent names the constraint kinds it needs (time window,
region, budget …) and user phrasings in English and Chinese with ``{slot}`` placeholders that the
input generator fills (Python ``str.format`` on trusted catalogue strings only, never on data).
Phrasings are deliberately varied, with optional detail clauses, so that two requests of the same
intent differ by more than a city name and survive embedding dedup when they really differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Intent:
    """One thing a user asks for, with the constraints it carries and how users phrase it."""

    name: str
    constraints: tuple[str, ...]
    en: tuple[str, ...]
    zh: tuple[str, ...]
    keywords: tuple[str, ...] = ()
    """Words that, found in a scenario's service path or operations, point at this intent."""


@dataclass(frozen=True, slots=True)
class Domain:
    name: str
    intents: tuple[Intent, ...]
    actions: tuple[str, ...]
    """Session-history actions typical of the domain (``search``, ``view_item`` …)."""
    details_en: tuple[str, ...] = field(default=())
    details_zh: tuple[str, ...] = field(default=())
    keywords: tuple[str, ...] = ()


CONSTRAINT_KINDS = ("time_window", "region", "budget", "party_size", "quantity", "channel", "priority")

DOMAINS: tuple[Domain, ...] = (
    Domain(
        name="travel",
        keywords=("travel", "trip", "flight", "hotel", "booking", "itinerary", "airline"),
        actions=(
            "search_flights",
            "view_hotel",
            "compare_prices",
            "read_reviews",
            "add_traveller",
            "view_map",
        ),
        details_en=(
            "I prefer a window seat if possible.",
            "A late check-out would really help.",
            "Please avoid red-eye connections.",
            "Somewhere quiet, close to the metro.",
            "My loyalty number is already on file.",
            "Breakfast included would be ideal.",
            "We are travelling with a toddler.",
            "I need an invoice for my employer.",
        ),
        details_zh=(
            "最好是靠窗的座位。",
            "希望可以延迟退房。",
            "请避开凌晨的中转航班。",
            "希望离地铁站近一点，环境安静。",
            "我的会员号已经绑定了。",
            "最好含早餐。",
            "我们带着一个两岁的孩子。",
            "需要开具公司抬头的发票。",
        ),
        intents=(
            Intent(
                "book_hotel",
                ("time_window", "region", "budget", "party_size"),
                en=(
                    "Find me a hotel in {city} from {start} to {end} for {party} people, under {budget}.",
                    "I need a room in {city} between {start} and {end}; budget is {budget} per night.",
                    "Can you book {party} guests into somewhere central in {city}, "
                    "{start}–{end}, max {budget}?",
                    "Looking for accommodation near the business district of {city}, {start} to {end}, "
                    "{party} adults, no more than {budget}.",
                ),
                zh=(
                    "帮我在{city}订一家酒店，{start}到{end}，{party}个人，预算{budget}以内。",
                    "{start}至{end}需要在{city}住宿，每晚不超过{budget}。",
                    "请给{party}位客人在{city}市中心找个酒店，时间是{start}到{end}，最多{budget}。",
                ),
                keywords=("hotel", "lodging", "room"),
            ),
            Intent(
                "search_flight",
                ("time_window", "region", "budget"),
                en=(
                    "Show me flights to {city} leaving between {start} and {end}, cheaper than {budget}.",
                    "What is the best fare to {city} departing {start}? I can spend up to {budget}.",
                    "I have to be in {city} by {end}; find a direct flight under {budget}.",
                ),
                zh=(
                    "查一下{start}到{end}之间飞往{city}的航班，价格低于{budget}。",
                    "{start}出发去{city}，最便宜的机票是多少？预算{budget}。",
                    "我需要在{end}之前到达{city}，找一个{budget}以内的直飞航班。",
                ),
                keywords=("flight", "fare", "airline", "air"),
            ),
            Intent(
                "change_itinerary",
                ("time_window", "priority"),
                en=(
                    "Please move my trip so that I return on {end} instead; this is {priority} priority.",
                    "My meeting moved — can I shift the booking to start on {start}?",
                    "Change my itinerary to {start} through {end}; treat it as {priority}.",
                ),
                zh=(
                    "请把我的行程改到{end}返回，优先级{priority}。",
                    "会议改期了，能把预订改到{start}开始吗？",
                    "把行程调整为{start}到{end}，按{priority}处理。",
                ),
                keywords=("itinerary", "change", "rebook"),
            ),
        ),
    ),
    Domain(
        name="ecommerce",
        keywords=("shop", "cart", "order", "checkout", "product", "catalog", "store", "inventory"),
        actions=(
            "search_product",
            "view_item",
            "add_to_cart",
            "remove_from_cart",
            "apply_coupon",
            "view_order",
        ),
        details_en=(
            "It is a gift, so please hide the price.",
            "I already have a coupon from last week.",
            "Eco-friendly packaging if you have it.",
            "The previous one arrived damaged.",
            "Size medium, in dark blue or black.",
            "I would like it before the weekend.",
            "Compare it with last year's model, please.",
        ),
        details_zh=(
            "是送人的礼物，请不要放价格单。",
            "我上周领了一张优惠券。",
            "如果有环保包装就更好了。",
            "上一次收到的东西有破损。",
            "要M码，深蓝色或黑色。",
            "希望周末之前能到。",
            "请和去年的款式比较一下。",
        ),
        intents=(
            Intent(
                "product_search",
                ("budget", "quantity", "region"),
                en=(
                    "Recommend {quantity} wireless earbuds under {budget} that ship to {city}.",
                    "I want a lightweight laptop for students, below {budget}, delivered in {city}.",
                    "Find {quantity} running shoes with good arch support for less than {budget}.",
                    "Which air purifier around {budget} works best for a small flat in {city}?",
                ),
                zh=(
                    "推荐{quantity}副{budget}以内、能送到{city}的无线耳机。",
                    "想买一台适合学生的轻薄笔记本，{budget}以下，送到{city}。",
                    "找{quantity}双足弓支撑好的跑鞋，价格低于{budget}。",
                    "{budget}左右的空气净化器，哪款适合{city}的小户型？",
                ),
                keywords=("search", "product", "catalog", "recommend"),
            ),
            Intent(
                "order_status",
                ("time_window", "channel"),
                en=(
                    "Where is my order placed on {start}? Please reply via {channel}.",
                    "My package was due by {end} and still has not arrived.",
                    "Track the parcel I ordered on {start} and tell me through {channel}.",
                ),
                zh=(
                    "我{start}下的订单到哪里了？请通过{channel}回复我。",
                    "包裹应该在{end}之前送到，现在还没收到。",
                    "帮我查一下{start}订的快递，结果发{channel}给我。",
                ),
                keywords=("order", "tracking", "shipment", "delivery"),
            ),
            Intent(
                "return_item",
                ("time_window", "channel", "priority"),
                en=(
                    "I want to return an item bought on {start}; contact me by {channel}.",
                    "The blender I received is faulty — start a refund, {priority} priority please.",
                    "How do I send back a jacket before {end}? I prefer {channel}.",
                ),
                zh=(
                    "我想退{start}买的商品，请用{channel}联系我。",
                    "收到的破壁机有故障，请尽快退款，优先级{priority}。",
                    "{end}之前怎么退回一件外套？我倾向于{channel}。",
                ),
                keywords=("return", "refund", "rma"),
            ),
        ),
    ),
    Domain(
        name="banking",
        keywords=("bank", "payment", "account", "card", "loan", "transfer", "ledger", "finance"),
        actions=(
            "login",
            "view_balance",
            "view_statement",
            "transfer_funds",
            "update_contact",
            "freeze_card",
        ),
        details_en=(
            "I am currently abroad.",
            "This is for my business account.",
            "I noticed it on the mobile app.",
            "My card has contactless payments enabled.",
            "I called yesterday but nobody picked up.",
            "Please do not close the account.",
        ),
        details_zh=(
            "我现在在国外。",
            "这是我的对公账户。",
            "我是在手机银行上看到的。",
            "我的卡开通了闪付。",
            "昨天打过电话但没人接。",
            "请不要注销这个账户。",
        ),
        intents=(
            Intent(
                "dispute_charge",
                ("time_window", "budget", "channel"),
                en=(
                    "There is a charge of {budget} on {start} that I do not recognise.",
                    "Please dispute a {budget} card payment made between {start} and {end}.",
                    "Someone used my card for {budget} on {start}; notify me via {channel}.",
                ),
                zh=(
                    "{start}有一笔{budget}的扣款，我不认识。",
                    "请对{start}到{end}之间一笔{budget}的刷卡消费提出争议。",
                    "有人在{start}用我的卡消费了{budget}，请通过{channel}通知我。",
                ),
                keywords=("dispute", "chargeback", "fraud"),
            ),
            Intent(
                "loan_inquiry",
                ("budget", "region", "time_window"),
                en=(
                    "What mortgage rate can I get for {budget} on a flat in {city}?",
                    "I want to borrow {budget} and repay it by {end}; what are my options?",
                    "Compare personal loans of about {budget} for someone living in {city}.",
                ),
                zh=(
                    "在{city}买房贷款{budget}，利率是多少？",
                    "我想借{budget}，{end}之前还清，有哪些方案？",
                    "帮我比较一下{city}居民大约{budget}的个人贷款。",
                ),
                keywords=("loan", "mortgage", "credit"),
            ),
            Intent(
                "transfer_money",
                ("budget", "region", "priority"),
                en=(
                    "Send {budget} to my landlord in {city} today, {priority} priority.",
                    "How long does an international transfer of {budget} to {city} take?",
                    "Set up a monthly transfer of {budget} to my savings account.",
                ),
                zh=(
                    "今天给{city}的房东转{budget}，优先级{priority}。",
                    "向{city}跨境汇款{budget}需要多长时间？",
                    "设置每月自动转{budget}到我的储蓄账户。",
                ),
                keywords=("transfer", "wire", "remit", "payment"),
            ),
        ),
    ),
    Domain(
        name="telecom",
        keywords=("telecom", "mobile", "plan", "sim", "network", "roaming", "billing", "broadband"),
        actions=("view_plan", "check_usage", "pay_bill", "open_ticket", "run_speed_test", "view_coverage"),
        details_en=(
            "I work from home most days.",
            "The problem started after the last update.",
            "There are four devices on the account.",
            "I have been a customer for ten years.",
            "Signal drops mostly in the evening.",
        ),
        details_zh=(
            "我大部分时间在家办公。",
            "上次系统更新后开始出问题。",
            "账户下有四台设备。",
            "我已经是十年的老用户了。",
            "主要是晚上信号不好。",
        ),
        intents=(
            Intent(
                "plan_upgrade",
                ("budget", "region"),
                en=(
                    "Which data plan under {budget} a month has the best coverage in {city}?",
                    "Upgrade me to unlimited data if it stays below {budget}.",
                    "I need a family plan for {party} lines in {city}, max {budget} monthly.",
                ),
                zh=(
                    "每月{budget}以内，哪个套餐在{city}信号最好？",
                    "如果不超过{budget}，帮我升级到无限流量。",
                    "在{city}办一个{party}张卡的家庭套餐，每月最多{budget}。",
                ),
                keywords=("plan", "upgrade", "tariff", "subscription"),
            ),
            Intent(
                "network_issue",
                ("region", "time_window", "priority"),
                en=(
                    "My broadband in {city} keeps dropping since {start}; this is {priority}.",
                    "No mobile signal in {city} between {start} and {end} — is there an outage?",
                    "Internet speed has been terrible since {start}; please send a technician.",
                ),
                zh=(
                    "自{start}以来我在{city}的宽带一直断线，优先级{priority}。",
                    "{start}到{end}在{city}完全没有信号，是有故障吗？",
                    "从{start}开始网速特别慢，请派技术人员上门。",
                ),
                keywords=("network", "outage", "signal", "broadband", "ticket"),
            ),
            Intent(
                "roaming_query",
                ("region", "time_window", "budget"),
                en=(
                    "I travel to {city} from {start} to {end}; what will roaming cost?",
                    "Add a roaming pack for {city} that costs less than {budget}.",
                    "Is data roaming in {city} included in my plan for the trip starting {start}?",
                ),
                zh=(
                    "我{start}到{end}去{city}，漫游费用是多少？",
                    "帮我加一个{city}的漫游包，费用低于{budget}。",
                    "{start}出发去{city}，我的套餐包含流量漫游吗？",
                ),
                keywords=("roaming", "international"),
            ),
        ),
    ),
    Domain(
        name="food_delivery",
        keywords=("food", "restaurant", "menu", "delivery", "courier", "kitchen", "meal"),
        actions=(
            "browse_menu",
            "add_dish",
            "apply_voucher",
            "track_courier",
            "rate_order",
            "search_restaurant",
        ),
        details_en=(
            "One of us is vegetarian.",
            "No peanuts — severe allergy.",
            "Leave it with the building reception.",
            "Not too spicy, please.",
            "We are watching a match, so quick is better.",
        ),
        details_zh=(
            "我们中有一位吃素。",
            "不要花生，严重过敏。",
            "放在大楼前台就行。",
            "不要太辣。",
            "我们在看球赛，越快越好。",
        ),
        intents=(
            Intent(
                "order_food",
                ("budget", "party_size", "time_window", "region"),
                en=(
                    "Order dinner for {party} in {city} around {start}, total under {budget}.",
                    "Find a noodle place in {city} that delivers before {end}, {budget} max.",
                    "Get lunch for {party} colleagues, arriving by {end}, about {budget} in total.",
                ),
                zh=(
                    "在{city}给{party}个人点晚餐，{start}左右送到，总价{budget}以内。",
                    "找一家{city}能在{end}前送到的面馆，最多{budget}。",
                    "给{party}位同事订午餐，{end}前送到，总共大约{budget}。",
                ),
                keywords=("order", "menu", "restaurant", "meal"),
            ),
            Intent(
                "delivery_complaint",
                ("time_window", "channel", "priority"),
                en=(
                    "My order from {start} arrived cold and late; please contact me via {channel}.",
                    "The courier marked it delivered at {start} but nothing came.",
                    "Half of my order was missing — I want a refund, {priority} priority.",
                ),
                zh=(
                    "我{start}的订单送到时已经凉了还迟到了，请通过{channel}联系我。",
                    "骑手显示{start}已送达，但我什么都没收到。",
                    "我的订单少了一半，要求退款，优先级{priority}。",
                ),
                keywords=("complaint", "courier", "late", "refund"),
            ),
            Intent(
                "schedule_order",
                ("time_window", "party_size", "budget"),
                en=(
                    "Schedule a catered lunch for {party} people on {start}, within {budget}.",
                    "Can I pre-order breakfast to arrive at {start} every weekday until {end}?",
                    "Book a birthday dinner delivery for {party} on {start}; budget {budget}.",
                ),
                zh=(
                    "{start}为{party}个人预订团餐，预算{budget}以内。",
                    "能否预订工作日早餐，从{start}开始每天送到，直到{end}？",
                    "{start}给{party}个人订生日晚餐外卖，预算{budget}。",
                ),
                keywords=("schedule", "catering", "preorder"),
            ),
        ),
    ),
)

DOMAIN_NAMES: tuple[str, ...] = tuple(d.name for d in DOMAINS)

CHANNELS_EN = ("email", "SMS", "phone", "in-app chat")
CHANNELS_ZH = ("邮件", "短信", "电话", "App内消息")
PRIORITIES_EN = ("low", "normal", "high", "urgent")
PRIORITIES_ZH = ("低", "普通", "高", "紧急")
TIERS = ("basic", "silver", "gold", "platinum")


def domain(name: str) -> Domain:
    """The domain called ``name`` (a KeyError names the known ones)."""
    for d in DOMAINS:
        if d.name == name:
            return d
    raise KeyError(f"unknown domain {name!r}; known: {', '.join(DOMAIN_NAMES)}")
