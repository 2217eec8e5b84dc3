"""Mean accepted length of the DSpark drafter at each block width, measured with vLLM itself.

As ``scripts/fixtures/mal.py`` measures the other drafters (temperature 0, float32, eager,
one process, the build's ``mal-prompts`` sets), with the plugin enabled (vLLM runs DSpark on
its V1 runner only through it) at a fixed K (``HUST_VSPEC_ADAPTIVE_SPECULATION=0``: the
plugin only observes)::

    python scripts/dspark_fixture/mal.py BUILD_DIR DSPARK_DIR OUT_JSON WIDTH [WIDTH ...]

Writes ``{width: {prompt_set: {"mal": .., "drafts": .., "draft_tokens": .., "accepted": ..}}}``.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fixtures import mal as FM  # noqa: E402

PLUGIN_ENV = {"HUST_VSPEC_ENABLED": "1", "HUST_VSPEC_ADAPTIVE_SPECULATION": "0",
              "HUST_VSPEC_ADAPTIVE_COST_PROBE": "0"}


def _measure(build: pathlib.Path, dspark: pathlib.Path, width: int, sets: dict) -> dict:
    """The counters of every prompt set from one engine drafting ``width`` tokens."""
    spec = {"method": "dspark", "model": str(dspark), "num_speculative_tokens": width}
    llm = FM.make_llm(str(build / "target"), spec)
    try:
        out = {name: FM.measure(llm, rows) for name, rows in sets.items()}
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    mal = {name: r["mal"] for name, r in out.items()}
    print(f"[dspark] MAL width {width}: {mal}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str]) -> int:
    build, dspark, out_json = pathlib.Path(argv[0]), pathlib.Path(argv[1]), pathlib.Path(argv[2])
    widths = [int(w) for w in argv[3:]]
    os.environ.update(PLUGIN_ENV)
    sets = {name: FM._rows(build / FM.MAL_PROMPTS / f"{name}.jsonl") for name in FM.PROMPT_SETS}
    results = {str(w): _measure(build, dspark, w, sets) for w in widths}
    out_json.write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
