"""MIG placement on each included product: every allowed start accepted, the invalid ones refused,
and the scored choice against first fit. Sources: ../shared/reference/MIG.md, cited per case
(§1.x = the product's profile table, §2.n = the placement rule)."""

from __future__ import annotations

import pydantic
import pytest

from finesched.model.binding import Binding, DeviceGrant
from finesched.model.mig import PRODUCTS, MIGGeometry
from finesched.model.node import Node
from finesched.plugins.deviceshare.mig import MIGRequest, choose_mig
from finesched.state.cluster import ClusterState, StateError
from finesched.state.invariants import check
from finesched.state.mig_slices import attach_mig_slices, node_mig_cards

#: product -> the MIG.md section its table comes from.
SOURCES = {
    "A100-40GB": "§1.1",
    "A100-80GB": "§1.2",
    "H100-80GB": "§1.3",
    "H100-94GB": "§1.4",
    "H100-96GB": "§1.4 (placements inferred)",
    "H200-141GB": "§1.5 (placements inferred)",
    "A30-24GB": "§1.6",
}


def mig_node(product: str, mode: str = "dynamic", instances: list[dict] | None = None, cards: int = 1) -> Node:
    devices = [
        {"type": "gpu", "minor": m, "mig": {"product": product, "mode": mode, "instances": instances or []}}
        for m in range(cards)
    ]
    return Node.model_validate({"name": "n", "allocatable": {"cpu": "8", "memory": "8Gi"}, "devices": devices})


def grant(key: str, profile: str, start: int, minor: int = 0) -> Binding:
    mig = {"profile": profile, "start": start}
    return Binding(workload=key, node="n", devices={"gpu": [DeviceGrant(minor=minor, mig=mig)]})


def every_start() -> list[object]:
    return [
        pytest.param(product, p.name, start, id=f"{product}-{p.name}@{start}-{SOURCES[product]}")
        for product, g in PRODUCTS.items()
        for p in g.profiles
        for start in p.starts
    ]


def invalid_starts() -> list[object]:
    """Every start on the axis a profile does not list, and one past the axis (§0 rule a)."""
    out = []
    for product, g in PRODUCTS.items():
        for p in g.profiles:
            for start in [*(s for s in range(g.memory_slices) if s not in p.starts), g.memory_slices]:
                out.append(pytest.param(product, p.name, start, id=f"{product}-{p.name}@{start}"))
    return out


def test_axis_width_comes_from_the_product() -> None:
    # §0: 8 memory slices on A100/H100/H200, 4 on A30; 7 compute slices on the 8-wide parts, 4 on A30.
    widths = {name: (g.memory_slices, g.compute_slices) for name, g in PRODUCTS.items()}
    assert widths["A30-24GB"] == (4, 4)
    assert all(widths[n] == (8, 7) for n in PRODUCTS if n != "A30-24GB")


@pytest.mark.parametrize(("product", "profile", "start"), every_start())
def test_every_allowed_start_is_accepted_on_an_empty_card(product: str, profile: str, start: int) -> None:
    node = mig_node(product)
    state = ClusterState.from_nodes([node])
    attach_mig_slices(state)
    state.assume(grant("ns/w", profile, start))  # a binding holding it
    mig_node(product, instances=[{"profile": profile, "start": start}])  # and as an existing instance
    assert check(state) == []


@pytest.mark.parametrize(("product", "profile", "start"), invalid_starts())
def test_a_start_the_profile_does_not_list_is_refused(product: str, profile: str, start: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="may start only at"):
        mig_node(product, instances=[{"profile": profile, "start": start}])
    state = ClusterState.from_nodes([mig_node(product)])
    attach_mig_slices(state)
    with pytest.raises(StateError, match="is not a placement"):
        state.assume(grant("ns/w", profile, start))
    assert check(state) == [] and not state.bindings


@pytest.mark.parametrize(
    ("product", "instances", "message"),
    [
        # §2.1 / nvml.h: an instance occupies its slices; creation fails on overlap.
        pytest.param("H100-80GB", [("3g.40gb", 0), ("1g.10gb", 3)], "overlaps", id="overlap-§2.1"),
        # §1.3 "max": at most 2 3g.40gb... and 1 4g.40gb; 4g@0 blocks 3g@0 by overlap, so use +me caps.
        pytest.param("H100-80GB", [("1g.10gb+me", 0), ("1g.10gb+me", 1)], "at most 1", id="me-cap-§2.7"),
        # §2.7 (inferred for A30): the two +me profiles share the chip's one JPEG/OFA engine.
        pytest.param("A30-24GB", [("1g.6gb+me", 0), ("2g.12gb+me", 2)], "media-extension", id="a30-me-pair-§2.7"),
        # §2.6: 7g needs the whole card.
        pytest.param("A100-40GB", [("7g.40gb", 0), ("1g.5gb", 6)], "overlaps", id="7g-needs-empty-§2.6"),
        # §2.3: a size-1 profile never starts at 7.
        pytest.param("A100-80GB", [("1g.10gb", 7)], "may start only", id="slot7-§2.3"),
        # §2.4: 2g cannot sit at 6 (the size-2 1g can).
        pytest.param("H100-80GB", [("2g.20gb", 6)], "may start only", id="2g-not-at-6-§2.4"),
    ],
)
def test_instances_that_cannot_coexist_are_refused(
    product: str, instances: list[tuple[str, int]], message: str
) -> None:
    listed = [{"profile": p, "start": s} for p, s in instances]
    with pytest.raises(pydantic.ValidationError, match=message):
        mig_node(product, instances=listed)


@pytest.mark.parametrize(
    ("product", "instances"),
    [
        pytest.param("H100-80GB", [("4g.40gb", 0), ("3g.40gb", 4)], id="4g+3g-full-layout-§2.5"),
        pytest.param("H100-80GB", [("3g.40gb", 0), ("3g.40gb", 4)], id="3g+3g-leaves-1-SM-idle-§2.2"),
        pytest.param(
            "A100-40GB", [("1g.10gb", 6), ("3g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5)], id="1g-size2-at-6-§2.3"
        ),
        pytest.param("H100-80GB", [("1g.10gb", s) for s in range(7)], id="seven-1g-§1.3"),
        pytest.param("A30-24GB", [("2g.12gb", 0), ("1g.6gb", 2), ("1g.6gb", 3)], id="a30-12gb+2x6gb-§1.6"),
        pytest.param(
            "H100-80GB", [("1g.10gb+me", 0), *(("1g.10gb", s) for s in range(1, 7))], id="one-me-plus-six-§2.7"
        ),
    ],
)
def test_valid_full_layouts_are_accepted(product: str, instances: list[tuple[str, int]]) -> None:
    node = mig_node(product, mode="static", instances=[{"profile": p, "start": s} for p, s in instances])
    (card,) = node_mig_cards(node)
    assert card.existing.bit_count() == len(instances)


def _card(product: str, held: list[tuple[str, int]], mode: str = "dynamic"):
    (card,) = node_mig_cards(mig_node(product, mode))
    g: MIGGeometry = card.geometry
    for profile, start in held:
        card = card.with_held(g.placement_lookup[(profile, start)])
    return card


def _placed(card, choice) -> list[tuple[str, int]]:
    g = card.geometry
    return [(g.profiles[g.placements[j][0]].name, g.placements[j][1]) for _, j in choice]


@pytest.mark.parametrize(
    ("product", "held", "ask", "greedy", "scored", "kept"),
    [
        # MIG.md §2.8: the guide's -cgi 19,19,14,9 fails; 3g needs 0 or 4. With a 1g at 6 (slice 6
        # blocks 3g@4), first fit puts a 2g at 0 and no 3g fits any more; the score puts it at 4.
        pytest.param(
            "H100-80GB", [("1g.10gb", 6)], "2g.20gb", ("2g.20gb", 0), ("2g.20gb", 4), "3g.", id="H100-2g-keeps-3g"
        ),
        pytest.param(
            "A100-40GB", [("1g.5gb", 6)], "2g.10gb", ("2g.10gb", 0), ("2g.10gb", 4), "3g.", id="A100-40-2g-keeps-3g"
        ),
        pytest.param(
            "A100-80GB", [("1g.10gb", 5)], "1g.10gb", ("1g.10gb", 0), ("1g.10gb", 4), "3g.", id="A100-80-1g-keeps-3g"
        ),
        # An empty card: the driver's own first 1g goes to 6 (§2.8); first fit takes 0 and kills the 4g.
        pytest.param(
            "H100-94GB", [("1g.12gb", 6)], "2g.24gb", ("2g.24gb", 0), ("2g.24gb", 4), "3g.", id="H100-94-2g-keeps-3g"
        ),
        pytest.param(
            "H100-96GB", [("1g.12gb", 6)], "2g.24gb", ("2g.24gb", 0), ("2g.24gb", 4), "3g.", id="H100-96-2g-keeps-3g"
        ),
        pytest.param(
            "H200-141GB", [("1g.18gb", 6)], "2g.35gb", ("2g.35gb", 0), ("2g.35gb", 4), "3g.", id="H200-2g-keeps-3g"
        ),
        pytest.param("H100-94GB", [], "1g.12gb", ("1g.12gb", 0), ("1g.12gb", 6), "4g.", id="H100-94-1g-to-6"),
        pytest.param("H200-141GB", [], "1g.18gb", ("1g.18gb", 0), ("1g.18gb", 6), "4g.", id="H200-1g-to-6"),
    ],
)
def test_scored_choice_keeps_a_later_large_profile_placeable(product, held, ask, greedy, scored, kept) -> None:
    card = _card(product, held)
    request = MIGRequest(((ask, 1),))
    large = next(p.name for p in card.geometry.profiles if p.name.startswith(kept))
    k3 = card.geometry.profile_index(large)
    first = choose_mig([card], request, first_fit=True)
    best = choose_mig([card], request)
    assert first is not None and best is not None
    assert _placed(card, first) == [greedy] and _placed(card, best) == [scored]
    after_first = card.with_held(first[0][1])
    after_best = card.with_held(best[0][1])
    assert k3 is not None and after_first.capacity(k3) == 0 < after_best.capacity(k3)


def test_a30_scored_choice_keeps_a_2g_placeable() -> None:
    # §1.6 (4-slice axis; mixes 2 x 12GB, 12GB + 2 x 6GB, 4 x 6GB). With a 1g at 3, first fit puts
    # the next 1g at 0 and no 2g.12gb fits; the score puts it at 2 and keeps 2g@0.
    card = _card("A30-24GB", [("1g.6gb", 3)])
    request = MIGRequest((("1g.6gb", 1),))
    best, first = choose_mig([card], request), choose_mig([card], request, first_fit=True)
    assert _placed(card, best) == [("1g.6gb", 2)] and _placed(card, first) == [("1g.6gb", 0)]
    k2 = card.geometry.profile_index("2g.12gb")
    assert card.with_held(best[0][1]).capacity(k2) == 1 and card.with_held(first[0][1]).capacity(k2) == 0


def test_static_card_only_assigns_existing_instances() -> None:
    node = mig_node("H100-80GB", "static", [{"profile": "3g.40gb", "start": 4, "uuid": "MIG-a"}])
    (card,) = node_mig_cards(node)
    assert choose_mig([card], MIGRequest((("1g.10gb", 1),))) is None  # nothing to create on a static card
    choice = choose_mig([card], MIGRequest((("3g.40gb", 1),)))
    assert choice is not None and _placed(card, choice) == [("3g.40gb", 4)]
    assert card.uuid_of(choice[0][1]) == "MIG-a"
    assert choose_mig([card], MIGRequest((("3g.40gb", 2),))) is None


def test_dynamic_card_reuses_an_existing_instance_before_cutting_a_new_one() -> None:
    node = mig_node("H100-80GB", "dynamic", [{"profile": "1g.10gb", "start": 2, "uuid": "MIG-b"}])
    (card,) = node_mig_cards(node)
    choice = choose_mig([card], MIGRequest((("1g.10gb", 1),)))
    assert choice is not None and _placed(card, choice) == [("1g.10gb", 2)]


def test_several_profiles_are_placed_largest_first_with_backtracking() -> None:
    # §2.5: 4g has one start (0); placing the 3g first at 0 would block it.
    card = _card("H100-80GB", [])
    choice = choose_mig([card], MIGRequest((("3g.40gb", 1), ("4g.40gb", 1))))
    assert choice is not None and sorted(_placed(card, choice)) == [("3g.40gb", 4), ("4g.40gb", 0)]
    assert choose_mig([card], MIGRequest((("3g.40gb", 1), ("7g.80gb", 1)))) is None


def test_capacity_counts_compute_and_caps() -> None:
    card = _card("H100-80GB", [("4g.40gb", 0)])
    g = card.geometry
    assert card.capacity(g.profile_index("3g.40gb")) == 1  # 3g@4: compute 4 + 3 = 7
    assert card.capacity(g.profile_index("1g.10gb")) == 3  # slices 4-6 (slice 7 is the size-2 1g's only)
    assert card.capacity(g.profile_index("1g.20gb")) == 2  # starts 4 and 6
    assert card.capacity(g.profile_index("1g.10gb+me")) == 1
    me = card.with_held(g.placement_lookup[("1g.10gb+me", 4)])
    assert me.capacity(g.profile_index("1g.10gb+me")) == 0
