"""Write a tiny three-site segmentation dataset in the layout the `folders` family reads:

    <out>/<site>/images/<stem>.png   grey-level images
    <out>/<site>/masks/<stem>.png    masks: 0 background, 128 class 1, 255 class 2

    python examples/make_dataset.py examples/data

It stands in for your hospitals' data (docs/extending.md, "Run the baselines on your data").
"""

import argparse
import json
from pathlib import Path

from fedmedbench.data.folders import write_example

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("out", type=Path, help="the data folder to create (must not exist or be empty)")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
made = write_example(
    args.out, kind="segmentation", sites=("siteA", "siteB", "siteC"), seed=args.seed, counts=(8, 10, 12)
)
print(f"wrote {args.out}: images per site {json.dumps(made['counts'])}")
