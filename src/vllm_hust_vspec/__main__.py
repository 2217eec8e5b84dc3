"""``python -m vllm_hust_vspec`` = the ``vllm-hust-vspec`` launcher."""

import sys

from vllm_hust_vspec.launcher.cli import main

sys.exit(main())
