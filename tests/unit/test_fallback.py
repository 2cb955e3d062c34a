"""speculate.fallback: when a request stops drafting, for how long, and when it tries again."""

from swiftspec.speculate.fallback import MAX_PLAIN_ROUNDS, PLAIN_ROUNDS, WINDOW, Fallback


def _window(rule: Fallback, seconds: float, tokens: int, plain_estimate_s: float = 0.05) -> None:
    for _ in range(WINDOW):
        assert rule.drafts()
        rule.record(True, seconds, tokens, plain_estimate_s)


def _plain_stretch(rule: Fallback, seconds: float = 0.05) -> int:
    rounds = 0
    while not rule.drafts():
        rule.record(False, seconds, 1, 0.05)
        rounds += 1
    return rounds


def test_rounds_that_beat_plain_decoding_keep_drafting():
    rule = Fallback()
    for _ in range(5):
        _window(rule, seconds=0.1, tokens=3)  # 30 tokens/s against 20 plain
    assert rule.drafts() and rule.plain_rounds == 0


def test_a_losing_window_decodes_plainly_then_probes_again_with_a_doubling_stretch():
    rule = Fallback()
    _window(rule, seconds=0.12, tokens=2)  # 16.7 tokens/s against the profiled 20
    assert not rule.drafts()
    assert _plain_stretch(rule) == PLAIN_ROUNDS
    _window(rule, seconds=0.12, tokens=2)  # the probe loses too
    assert _plain_stretch(rule) == 2 * PLAIN_ROUNDS
    for _ in range(8):
        _window(rule, seconds=0.12, tokens=2)
        _plain_stretch(rule)
    _window(rule, seconds=0.12, tokens=2)
    assert _plain_stretch(rule) == MAX_PLAIN_ROUNDS
    assert rule.plain_rounds > MAX_PLAIN_ROUNDS


def test_measured_plain_rounds_replace_the_estimate():
    rule = Fallback()
    _window(rule, seconds=0.12, tokens=2)
    _plain_stretch(rule, seconds=0.2)  # plain decoding is slower than the profile said: 5 tokens/s
    _window(rule, seconds=0.12, tokens=2)  # 16.7 tokens/s beats the measured 5
    assert rule.drafts()


def test_a_won_probe_resets_the_stretch():
    rule = Fallback()
    _window(rule, seconds=0.12, tokens=2)
    _plain_stretch(rule)
    _window(rule, seconds=0.12, tokens=2)
    _plain_stretch(rule)
    _window(rule, seconds=0.05, tokens=3)  # drafting pays again
    _window(rule, seconds=0.12, tokens=2)
    assert _plain_stretch(rule) == PLAIN_ROUNDS


def test_without_any_plain_cost_the_rule_never_stops_drafting():
    rule = Fallback()
    _window(rule, seconds=1.0, tokens=1, plain_estimate_s=0.0)
    assert rule.drafts()
