"""GPUs wired to each other directly (DGX-1 / p3.16xlarge hybrid cube-mesh): the rings a group
can run, against NVIDIA's description of the topology, hand counts and brute force; the
collective and point-to-point bandwidths both engines then use; the profile key's loader."""
import random
import tomllib
from itertools import combinations_with_replacement, permutations
from pathlib import Path

import pytest

from parsim.cluster import nvlink_mesh
from parsim.cluster.collectives import collective_time, group_path
from parsim.cluster.hardware import dumps_profile, load_profile, parse_profile
from parsim.errors import ConfigError
from parsim.sim.collective_flows import plan_collective
from parsim.sim.network import Topology

P3 = load_profile("aws-p3.16xlarge")
LINK = 25e9  # NVLink2: 25 GB/s per direction per link (the profile: 150 GB/s over 6 links)
EFF = 0.8    # the profile's nvlink_efficiency


def _valid(links, members, rings):
    """Every ring visits every member once along direct links, and no pair carries more rings
    in one direction than it has links."""
    use = {}
    for r in rings:
        assert sorted(r) == sorted(members)
        for a, b in zip(r, r[1:] + r[:1]):
            assert links[a][b] > 0
            use[(a, b)] = use.get((a, b), 0) + 1
    assert all(n <= links[a][b] for (a, b), n in use.items())


def test_the_whole_cube_mesh_runs_three_rings_each_way():
    # NVIDIA's DGX-1 (V100) whitepaper: "three interwoven rings of single NVLink connections"
    links, every = P3.nvlink_links, tuple(range(8))
    rings = nvlink_mesh.rings(links, every)
    assert len(rings) == 6
    _valid(links, every, rings)
    assert nvlink_mesh.links_per_gpu(links) == 6 and P3.nvlink_link_bandwidth == pytest.approx(LINK)


def test_a_pair_runs_one_ring_per_link_between_them():
    for a in range(8):
        for b in range(a + 1, 8):
            assert len(nvlink_mesh.rings(P3.nvlink_links, (a, b))) == P3.nvlink_links[a][b]


def test_four_gpus_of_one_half_hand_counted():
    # 0-1:1 0-2:1 0-3:2 1-2:2 1-3:1 2-3:2. The cycle 0-1-2-3 leaves 0-2, 0-3, 1-2, 1-3, 2-3 one
    # link each, which close 0-2-1-3; no third cycle (GPU 0 has 4 links here: two cycles).
    rings = nvlink_mesh.rings(P3.nvlink_links, (0, 1, 2, 3))
    assert len(rings) == 4
    _valid(P3.nvlink_links, (0, 1, 2, 3), rings)
    # 0, 1, 4, 5: 0-1:1 0-4:2 1-5:2 4-5:1, 0-5 and 1-4 none: only 0-1-5-4 closes
    assert len(nvlink_mesh.rings(P3.nvlink_links, (0, 1, 4, 5))) == 2
    # 0 and 5 have no link: no ring
    assert nvlink_mesh.rings(P3.nvlink_links, (0, 5)) == ()


def _brute_force_cycles(links, members):
    """Most Hamiltonian cycles sharing no link, by trying every multiset of cycles."""
    first = members[0]
    cycles = {tuple(min((c, (c[0], *reversed(c[1:]))))) for c in
              ((first, *p) for p in permutations(members[1:]))
              if all(links[a][b] for a, b in zip(c, c[1:] + c[:1]))}
    cycles = sorted(cycles)
    best = 0
    for k in range(1, 4):
        for combo in combinations_with_replacement(cycles, k):
            use = {}
            for c in combo:
                for a, b in zip(c, c[1:] + c[:1]):
                    e = (min(a, b), max(a, b))
                    use[e] = use.get(e, 0) + 1
            if all(n <= links[a][b] for (a, b), n in use.items()):
                best = max(best, k)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_ring_packing_equals_brute_force_on_random_meshes(seed):
    rng = random.Random(seed)
    n = rng.choice([3, 4, 5])
    links = [[0] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            links[a][b] = links[b][a] = rng.choice([0, 1, 1, 2])
    links = tuple(tuple(r) for r in links)
    members = tuple(range(n))
    rings = nvlink_mesh.rings(links, members)
    _valid(links, members, rings)
    assert len(rings) == 2 * _brute_force_cycles(links, members)


def test_group_bandwidth_is_the_rings_links():
    assert group_path(P3, [0, 1]).bandwidth == pytest.approx(1 * LINK * EFF)   # NV1
    assert group_path(P3, [2, 3]).bandwidth == pytest.approx(2 * LINK * EFF)   # NV2
    assert group_path(P3, [4, 5, 6, 7]).bandwidth == pytest.approx(4 * LINK * EFF)
    assert group_path(P3, list(range(8))).bandwidth == pytest.approx(6 * LINK * EFF)
    no_ring = group_path(P3, [0, 5])
    assert no_ring.name == "pcie" and no_ring.bandwidth == pytest.approx(P3.pcie.effective_bandwidth)
    # hand-computed all-reduce of 64 MiB on the NV1 pair: 2(n-1)/n S/B + 2(n-1) a at n = 2
    s = 64 * 2 ** 20
    assert collective_time(P3, "all_reduce", s, [0, 1]) == pytest.approx(s / (LINK * EFF) + 2 * P3.nvlink.latency_s)


def test_point_to_point_uses_the_pairs_links():
    assert P3.link_between(0, 4).effective_bandwidth == pytest.approx(2 * LINK * EFF)
    assert P3.link_between(0, 1).effective_bandwidth == pytest.approx(LINK * EFF)
    assert P3.link_between(0, 5).name == "pcie"
    assert P3.link_between(0, 8).name == "nic"  # another node: the network
    # an NVSwitch profile keeps one port per GPU for every pair
    h100 = load_profile("dgx-h100")
    assert h100.nvlink_links is None and h100.link_between(0, 5) == h100.nvlink


def test_full_mode_flows_cost_what_fast_mode_prices():
    topo = Topology(P3, 8)
    for group in ([0, 1], [2, 3], [0, 1, 2, 3], list(range(8)), [0, 5]):
        plan = plan_collective(P3, "all_reduce", 256e6, group)
        per_link: dict[int, float] = {}
        for ph in plan.phases:
            for a, b, nbytes in ph.flows:
                for lk in topo.route(a, b)[0]:
                    per_link[lk] = per_link.get(lk, 0.0) + nbytes
        # the busiest link, alone at its capacity, takes the fast mode's bandwidth term
        busiest = max(per_link[lk] / topo.capacity[lk] for lk in per_link)
        fast = collective_time(P3, "all_reduce", 256e6, group)
        lat = 2 * (len(group) - 1) * group_path(P3, group).latency_s
        assert busiest == pytest.approx(fast - lat, rel=1e-9), group
    assert topo.name(topo.route(0, 4)[0][0]) == "nv_pair[0->4]"


def test_alpa_benchmark_full_and_fast_agree():
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate
    sc = Path(__file__).resolve().parents[1] / "scenarios" / "alpa-gpt-2.6b-p3.toml"
    fast = simulate(load_scenario(sc)).metrics["step_time_s"]
    full = simulate(load_scenario(sc, overrides=["simulation.mode=full"])).metrics["step_time_s"]
    assert full == pytest.approx(fast, rel=0.03)


def test_profile_round_trips_the_links(tmp_path):
    path = tmp_path / "p3.toml"
    path.write_text(dumps_profile(P3))
    again = load_profile(str(path))
    assert again.nvlink_links == P3.nvlink_links
    assert group_path(again, [0, 1, 2, 3]).bandwidth == pytest.approx(group_path(P3, [0, 1, 2, 3]).bandwidth)


@pytest.mark.parametrize("edit,problem", [
    (lambda m: m[:-1], "8 x 8"),
    (lambda m: [[*r[:-1], 1] if i == 0 else r for i, r in enumerate(m)], "symmetric"),
    (lambda m: [[1, *r[1:]] if i == 0 else r for i, r in enumerate(m)], "itself"),
    (lambda m: [[-1 if j == 1 else x for j, x in enumerate(r)] if i == 0 else r for i, r in enumerate(m)],
     "link count"),
])
def test_bad_link_matrices_are_refused_in_one_line(edit, problem):
    import parsim
    text = (Path(parsim.__file__).parent / "cluster" / "profiles" / "aws-p3.16xlarge.toml").read_text()
    data = tomllib.loads(text)
    data["node"]["nvlink_links"] = edit([list(r) for r in P3.nvlink_links])
    with pytest.raises(ConfigError) as exc:
        parse_profile(data, "p3.toml")
    msg = str(exc.value)
    assert "node.nvlink_links" in msg and problem in msg and "\n" not in msg


def test_a_mesh_larger_than_the_ring_search_handles_is_refused():
    big = [[0 if a == b else 1 for b in range(9)] for a in range(9)]
    msg = nvlink_mesh.check_links(big, 9)
    assert isinstance(msg, str) and "up to 8" in msg
