#!/usr/bin/env bash
# FIM through the openai client (suffix) and /infill (curl), greedy, for --mode ar and --mode tree.
cd "$(dirname "$0")/../.."
for mode in ar tree; do
  .venv/bin/swiftspec serve --port 8765 --mode $mode > ${OUT:-/tmp}/serve-$mode.log 2>&1 &
  pid=$!
  for i in $(seq 1 240); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
  .venv/bin/python - <<PY > ${OUT:-/tmp}/fim-$mode-openai.txt
import json, openai, time
c = openai.OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="none")
prefix = open("swiftspec/data/fim8.jsonl").readline()
rec = json.loads(prefix)
pre = rec["prompt"][-3000:]; suf = rec["suffix"][:1500]
t = time.perf_counter()
r = c.completions.create(model="qwen2.5-coder-1.5b-instruct", prompt=pre, suffix=suf, max_tokens=64, temperature=0)
print(json.dumps({"text": r.choices[0].text, "finish": r.choices[0].finish_reason, "usage": r.usage.model_dump(), "s": time.perf_counter() - t}))
PY
  curl -s http://127.0.0.1:8765/infill -H "Content-Type: application/json" \
    -d '{"input_prefix": "import math\n\ndef circle_area(r):\n", "prompt": "    return", "input_suffix": "\n\n\ndef circle_perimeter(r):\n    return 2 * math.pi * r\n", "input_extra": [{"filename": "util.py", "text": "PI = 3.14159\n"}], "n_predict": 48, "temperature": 0}' \
    > ${OUT:-/tmp}/fim-$mode-infill.json
  kill $pid; wait $pid 2>/dev/null
done
