"""Outside CI: DeepSpeed's own ds_to_universal on a ucp-load output (sources, not installed)."""
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim  # noqa: F401
from deepspeed.checkpoint import ds_to_universal as d2u
sys.argv = ["ds_to_universal", "--input_folder", sys.argv[1], "--output_folder", sys.argv[2],
            "--num_extract_workers", "1", "--num_merge_workers", "1"]
d2u.main(d2u.parse_arguments())
