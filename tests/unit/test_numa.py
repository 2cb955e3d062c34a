"""NUMA placement of the async groups, planned on synthetic topologies (this machine has one node)."""

from __future__ import annotations

from swiftspec.parallel.numa import parse_cpulist, placement_line, plan_groups, read_nodes


def test_cpulists_parse() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_one_node_has_nothing_to_separate() -> None:
    assert plan_groups({0: [0, 1]}) is None
    assert "1 node" in placement_line({0: [0, 1]})


def test_two_nodes_give_each_group_its_own() -> None:
    plan = plan_groups({0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
    assert (plan.target_node, plan.draft_node) == (0, 1)
    assert plan.target_cores == [0, 1, 2, 3] and plan.draft_cores == [4, 5, 6, 7]
    assert placement_line({0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}) == \
        "numa: target group on node 0 (cores 0-3), draft group on node 1 (cores 4-7)"


def test_the_target_takes_the_largest_node_and_draft_cores_cap_the_draft() -> None:
    plan = plan_groups({0: [0, 1], 1: [2, 3, 4, 5], 2: [6, 7, 8]}, draft_cores=2)
    assert (plan.target_node, plan.draft_node) == (1, 2)
    assert plan.draft_cores == [6, 7]


def test_read_nodes_keeps_only_allowed_cores(tmp_path) -> None:
    for node, cpus in ((0, "0-1"), (1, "2-3")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus)
    assert read_nodes(tmp_path, allowed={0, 1, 2}) == {0: [0, 1], 1: [2]}
    assert read_nodes(tmp_path, allowed={0, 1}) == {0: [0, 1]}
