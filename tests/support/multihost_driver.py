"""The target host of netns_hosts.py (tests/distributed/test_multihost.py), run in its network namespace:
builds a RemoteEngine on tiny models and obeys one JSON command per stdin line, answering one JSON line each.

Commands: {"cmd": "gen", "prompts": [[ids]], "n": N, "notify": bool} -> {"outs", "degraded", "max_gap_s",
"seconds"} (with notify, {"event": "first"} comes after the first chunk); {"cmd": "rejoin", "wait_s": S}
-> {"joined": bool}; {"cmd": "quit"}.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from swiftspec.config import EngineConfig, LoadConfig, RemoteConfig, TreeConfig
from swiftspec.engines import build_engine
from swiftspec.sampling import SamplingParams


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def generate(engine, prompts: list[list[int]], n: int, notify: bool) -> dict:
    outs, max_gap, start = [], 0.0, time.monotonic()
    for prompt in prompts:
        out, last = [], time.monotonic()
        for chunk in engine.generate(prompt, SamplingParams(), n):
            now = time.monotonic()
            max_gap, last = max(max_gap, now - last), now
            if notify and not out:
                say({"event": "first"})
            out += chunk
        outs.append(out)
    return {"outs": outs, "degraded": engine.degraded is not None, "max_gap_s": max_gap,
            "seconds": time.monotonic() - start}


def main() -> None:
    target, draft, address, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    load = LoadConfig(dtype="float32", max_seq_len=512)
    engine = build_engine(EngineConfig(mode="async", target=target, draft=draft, target_load=load, draft_load=load,
                                       tree=TreeConfig(depth=2),
                                       remote=RemoteConfig(rendezvous=address, link_timeout=timeout)))
    say({"event": "ready", "port": engine.listener.port})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "gen":
            say(generate(engine, cmd["prompts"], cmd["n"], cmd.get("notify", False)))
        elif cmd["cmd"] == "rejoin":
            deadline = time.monotonic() + cmd["wait_s"]
            while engine.degraded and time.monotonic() < deadline:
                engine.recover() or time.sleep(0.2)
            say({"joined": engine.degraded is None})
        else:
            break
    engine.close()
    say({"event": "closed"})


if __name__ == "__main__":
    main()
