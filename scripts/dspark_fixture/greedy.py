"""The target's greedy continuations of token-id prefixes, generated with vLLM (transformers'
``generate`` takes ~20x longer on a 2-core CPU)::

    python scripts/dspark_fixture/greedy.py TARGET_DIR PREFIXES.npy OUT.npy NEW_TOKENS

``PREFIXES.npy``: int64 [n, prefix]; ``OUT.npy``: int64 [n, prefix + NEW_TOKENS] (no
end-of-sequence stop). Float32, eager, one process, temperature 0, as the MAL measurement.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from fixtures import mal as FM  # noqa: E402


def main(argv: list[str]) -> int:
    target, src, out, new = argv[0], pathlib.Path(argv[1]), pathlib.Path(argv[2]), int(argv[3])
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prefixes = np.load(src)
    llm = FM.make_llm(target, None, max_num_seqs=64)
    sp = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=[int(t) for t in row]) for row in prefixes], sp,
                        use_tqdm=False)
    gen = np.array([list(o.outputs[0].token_ids) for o in outs], dtype=np.int64)
    np.save(out, np.concatenate([prefixes.astype(np.int64), gen], axis=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
