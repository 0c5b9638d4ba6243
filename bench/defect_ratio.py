"""How much of a batch poison fails the same way, against which a defect is told apart.

A consumer calls a batch a defect when more than ``max_failure_ratio`` of it (and at least
``MIN_FAILURES`` messages) fails with one fingerprint (:mod:`poisonq.defects`). This measures
the share a realistic feed reaches without any defect: the demos' feeds (every kind of bad
order at its share, shuffled), cut into batches as a consumer would take them, and the worst
batch's largest same-kind share of failures, over many seeds. A transient failure counts
(it fails its first delivery); expiring orders do not (they never reach a consumer).

Prints one line per feed and batch size: ``feed=spark batch=100 seeds=200 worst_share=0.06
worst_failures=6 defect_batches=0``, where ``defect_batches`` counts the batches the default
rule would have stopped on.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from poisonq import demo
from poisonq.defects import DEFAULT_MAX_FAILURE_RATIO, MIN_FAILURES
from poisonq.spark.demo import DATAFRAME_JOB
from poisonq.spark.demo_map import MAP_JOB

FEEDS = {"engine": demo.SHARES, "spark": DATAFRAME_JOB.shares, "spark-map": MAP_JOB.shares}
NEVER_DELIVERED = {"expiring"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    for feed, shares in FEEDS.items():
        for batch in (10, 100, 1_000, 10_000, 100_000):
            worst_share, worst_failures, defects = 0.0, 0, 0
            for seed in range(args.seeds):
                orders = demo.make_orders(args.orders, random.Random(seed), dict(shares))
                kinds = [o.kind for o in orders if o.kind not in NEVER_DELIVERED]
                for start in range(0, len(kinds), batch):
                    part = kinds[start : start + batch]
                    failing = Counter(k for k in part if k != "good")
                    if not failing:
                        continue
                    _, top = failing.most_common(1)[0]
                    worst_share = max(worst_share, top / len(part))
                    worst_failures = max(worst_failures, top)
                    if top >= MIN_FAILURES and top > DEFAULT_MAX_FAILURE_RATIO * len(part):
                        defects += 1
            print(
                f"feed={feed} batch={batch} seeds={args.seeds} worst_share={worst_share:.3f}"
                f" worst_failures={worst_failures} defect_batches={defects}"
            )


if __name__ == "__main__":
    main()
