"""A second, differently shaped synthetic corpus: ships' histories written as prose.

Each ship, port and river gets a document of three paragraphs; the facts a question asks about sit
inside sentences among other facts (a sister ship's cargo, a rival captain, a later owner), never in
a record of `field: value` lines. Names are built from other sounds than `synthetic`'s, relations are
other relations (ship -> home port -> river -> mountains), questions have other wordings. It exists
to check that nothing else in the project is tuned to `synthetic`: write it out with
`harnessrl make-corpus DIR --generator voyages` and train with `harnessrl train --corpus --tasks`.
"""

from __future__ import annotations

import random

from harnessrl.envs.search.data import Doc, SearchTask

_ADJECTIVES = ["Brave", "Silent", "Golden", "Swift", "Patient", "Restless", "Northern", "Crimson", "Gentle", "Iron",
               "Wandering", "Bright", "Stubborn", "Lucky", "Weary", "Proud"]  # fmt: skip
_CREATURES = ["Heron", "Otter", "Gull", "Marten", "Petrel", "Seal", "Lynx", "Swan", "Badger", "Kestrel", "Pike",
              "Crane", "Falcon", "Hare", "Wren", "Stag"]  # fmt: skip
_FIRST = ["Ada", "Bram", "Cora", "Dirk", "Elin", "Fenna", "Gus", "Hilde", "Ivo", "Joris", "Katrin", "Lotte", "Maarten",
          "Nel", "Otto", "Pim", "Roos", "Sander", "Tess", "Wim"]  # fmt: skip
_FAMILY = ["Aldermoor", "Blackwater", "Cresswell", "Dunmore", "Eastwick", "Fairholm", "Greystone", "Hollin",
           "Ingleby", "Kettering", "Larkspur", "Marlowe", "Northgate", "Oakridge", "Pennyworth", "Quarrington",
           "Redfern", "Southby", "Thornbury", "Whitlock"]  # fmt: skip
_SOUNDS = ["vel", "ostr", "amb", "ery", "cal", "und", "orn", "esk", "ith", "ap", "ulm", "ar", "dov", "ia", "en", "rus"]
_CARGO = ["salt", "timber", "copper", "wool", "tea", "pepper", "tin", "amber", "linen", "tobacco", "marble", "coffee"]
_SHIP_INTRO = [
    "The {ship} was launched in {year} from a yard that no longer exists.",
    "Shipwrights finished the {ship} in {year}, after two winters of work.",
    "In {year} the {ship} first took to the water, a three-masted ship of modest size.",
]
_SHIP_CARGO = [
    "For most of her working life she carried {cargo}, and her holds were said to smell of it for decades.",
    "Her owners sent her out with {cargo}; on the return leg she often sailed half empty.",
    "Merchants trusted her with {cargo}, which she carried along the coast year after year.",
]
_SHIP_CAPTAIN = [
    "Her best-known master was {captain}, who kept a careful log of every voyage.",
    "{captain} commanded her for nineteen seasons and refused every offer to retire.",
    "Sailors remembered the years when {captain} was her captain as her finest.",
]
_SHIP_PORT = [
    "She was registered in {port}, and every spring she returned there for repairs.",
    "{port} was her home port; its harbour master kept her papers.",
    "Her home port was {port}, where a painting of her still hangs in the customs house.",
]
_SHIP_SISTER = [
    "She is often confused with the {other}, a sister ship that carried {other_cargo} under {other_captain}.",
    "The {other}, built on the same plans, hauled {other_cargo} and was commanded by {other_captain}.",
    "Records sometimes mix her up with the {other}, whose master {other_captain} dealt in {other_cargo}.",
]
_SHIP_MORE = [
    "Her figurehead was repainted every few years, and the colours changed with each new owner.",
    "In a great storm she lost her foremast but limped home with her cargo dry.",
    "She was finally broken up for timber, and parts of her deck became a tavern floor.",
]
_PORT_TEXT = [
    "{port} is a harbour town on the {river}. It was founded in {year} by {founder}, a ferryman turned trader.",
    "Built where the {river} widens, {port} grew from a fishing village. {founder} laid out its first quay in {year}.",
    "The town of {port} stands on the {river}; {founder} founded it in {year} and gave it its market charter.",
]
_PORT_MORE = [
    "Its fish market opens before dawn, and its narrow streets climb steeply from the water.",
    "Travellers describe a busy harbour, a lighthouse on the breakwater and a bell that rings at high tide.",
    "Floods have reached its lower town several times; the old warehouses stand on stone piers.",
]
_RIVER_TEXT = [
    "The {river} rises in the {mountains} and runs {length} kilometres to the sea.",
    "From its source high in the {mountains}, the {river} flows {length} kilometres before it reaches the coast.",
    "The {river} is {length} kilometres long. Its springs lie in the {mountains}, among pine forests.",
]
_RIVER_MORE = [
    "Barges once carried grain down its lower reaches, and several mills still stand on its banks.",
    "In dry summers it can be waded at the fords, while spring melt floods the meadows along it.",
    "Its water is cold and clear in the hills and brown with silt where it meets the tide.",
]


def voyages(
    seed: int = 0, ships: int = 90, ports: int = 24, rivers: int = 8, test_share: float = 0.25
) -> tuple[list[Doc], list[SearchTask]]:
    """A deterministic prose corpus about ships, their home ports and those ports' rivers, and 1-3 hop
    questions whose answers sit inside the prose."""
    rng = random.Random(f"voyages:{seed}")
    used: set[str] = set()

    def unique(make) -> str:
        while (value := make()) in used:
            pass
        used.add(value)
        return value

    def place() -> str:
        return "".join(rng.choice(_SOUNDS) for _ in range(rng.randint(2, 3))).capitalize()

    def person() -> str:
        return unique(lambda: f"{rng.choice(_FIRST)} {rng.choice(_FAMILY)}")

    river = [
        {"id": f"river-{i}", "name": unique(lambda: place() + " River"), "mountains": unique(lambda: place() + " Hills"),
         "length": rng.randint(40, 900)}
        for i in range(rivers)
    ]  # fmt: skip
    port = [
        {"id": f"port-{i}", "name": unique(place), "river": rng.choice(river), "year": rng.randint(900, 1700),
         "founder": person()}
        for i in range(ports)
    ]  # fmt: skip
    ship = [
        {"id": f"ship-{i}", "name": unique(lambda: f"{rng.choice(_ADJECTIVES)} {rng.choice(_CREATURES)}"),
         "port": rng.choice(port), "year": rng.randint(1750, 1900), "cargo": rng.choice(_CARGO), "captain": person()}
        for i in range(ships)
    ]  # fmt: skip

    docs = []
    for s in ship:
        other = rng.choice([o for o in ship if o is not s])
        facts = {"ship": s["name"], "year": s["year"], "cargo": s["cargo"], "captain": s["captain"],
                 "port": s["port"]["name"], "other": other["name"], "other_cargo": other["cargo"],
                 "other_captain": other["captain"]}  # fmt: skip
        sentences = [rng.choice(t).format(**facts) for t in (_SHIP_CAPTAIN, _SHIP_PORT, _SHIP_SISTER)]
        rng.shuffle(sentences)
        paragraphs = [rng.choice(_SHIP_INTRO).format(**facts) + " " + rng.choice(_SHIP_CARGO).format(**facts),
                      " ".join(sentences[:2]), sentences[2] + " " + rng.choice(_SHIP_MORE)]  # fmt: skip
        docs.append(Doc(id=s["id"], title=f"The {s['name']}", text="\n\n".join(paragraphs)))
    for p in port:
        facts = {"port": p["name"], "river": p["river"]["name"], "year": p["year"], "founder": p["founder"]}
        docs.append(Doc(id=p["id"], title=p["name"], text=rng.choice(_PORT_TEXT).format(**facts) + "\n\n" + rng.choice(_PORT_MORE)))  # fmt: skip
    for r in river:
        facts = {"river": r["name"], "mountains": r["mountains"], "length": r["length"]}
        docs.append(Doc(id=r["id"], title=r["name"], text=rng.choice(_RIVER_TEXT).format(**facts) + "\n\n" + rng.choice(_RIVER_MORE)))  # fmt: skip

    tasks = []
    for i, s in enumerate(ship):
        p, r, n = s["port"], s["port"]["river"], s["name"]
        hops = 1 + i % 3
        if hops == 1:
            q, a, family = rng.choice([(f"Who was the best-known captain of the {n}?", s["captain"], "captain"),
                                       (f"What cargo did the {n} carry?", s["cargo"], "cargo"),
                                       (f"When was the {n} launched?", str(s["year"]), "launch_year")])  # fmt: skip
            gold = [s["id"]]
        elif hops == 2:
            q, a, family = rng.choice([(f"Which river flows past the home port of the {n}?", r["name"], "port_river"),
                                       (f"Who founded the port the {n} sailed from?", p["founder"], "port_founder")])  # fmt: skip
            gold = [s["id"], p["id"]]
        else:
            q, a, family = (
                f"In which mountains is the source of the river at the {n}'s home port?",
                r["mountains"],
                "river_source",
            )
            gold = [s["id"], p["id"], r["id"]]
        split = "test" if rng.random() < test_share else "train"
        tasks.append(SearchTask(id=f"v-{i}", question=q, answer=a, gold_doc_ids=gold, split=split, family=family))
    return docs, tasks
