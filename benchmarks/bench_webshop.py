"""WebShop env speed and fidelity figures: step time, search latency, search parity, goal order.

    python benchmarks/bench_webshop.py            # all figures (~15 s on 2 cores)
    python benchmarks/bench_webshop.py --json     # one JSON object instead of the table

Figures:

* **start-up**: building the shared world (catalogue, 6910 goals, BM25 index) with no index
  cache, and again from the on-disk cache (what every env worker pays once);
* **step time** (ms): scripted episodes on the first 100 test goals (search the instruction, open
  a product, options, description and back, next page, buy), split into search steps and the
  other (click) steps; the original WebShop measured ≈ 27 ms per step and ≈ 74 ms per search step;
* **query latency** (ms per query, k = 50) over the 2539 fixture queries (Anserini: 3–6 ms);
* **search parity** with Anserini 0.22.1 on those queries: top-10 overlap, top-1 agreement,
  identical top-10 order, identical top-50 list;
* **goal order**: goals equal to ``synthetic_goals_seed233.jsonl`` (asin, text, attributes,
  options), in order; and the oracle figures (goals where the exact target with
  the exact options scores < 1, and the mean oracle score).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serl.envs.base import Task  # noqa: E402
from serl.envs.webshop import WebShopEnv, env as wsenv  # noqa: E402
from serl.envs.webshop.catalog import hidden_price, search_contents  # noqa: E402
from serl.envs.webshop.data import read_jsonl  # noqa: E402
from serl.envs.webshop.goals import priced_goal  # noqa: E402
from serl.envs.webshop.reward import get_reward  # noqa: E402
from serl.envs.webshop.search import SearchIndex  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"


def bench_startup() -> dict:
    t0 = time.perf_counter()
    world = wsenv.load_world()
    with tempfile.TemporaryDirectory() as tmp:
        t1 = time.perf_counter()
        docs = [search_contents(p) for p in world.catalog.products]
        ids = [p.asin for p in world.catalog.products]
        SearchIndex(ids, docs, cache_dir=tmp)  # cold build (stems already cached in-process)
        t2 = time.perf_counter()
        SearchIndex(ids, docs, cache_dir=tmp)  # from the disk cache
        t3 = time.perf_counter()
    return {"world_load_s": t1 - t0, "index_build_s": t2 - t1, "index_from_cache_s": t3 - t2}


def bench_steps(num_goals: int = 100) -> dict:
    env = WebShopEnv()
    search_t, click_t = [], []

    def timed(action: str, bucket: list) -> object:
        t = time.perf_counter()
        r = env.step(action)
        bucket.append(time.perf_counter() - t)
        return r

    for rnd in range(2):  # round 0 warms caches (stems of new words)
        search_t.clear()
        click_t.clear()
        for i in range(num_goals):
            r = env.reset(Task("webshop", str(i), "webshop", 0))
            r = timed(f"search[{r.task}]", search_t)
            products = [a for a in r.admissible_actions if a.startswith("click[b")]
            r = timed(products[0], click_t)
            opts = r.admissible_actions[6:8]
            for a in opts:
                r = timed(a, click_t)
            for a in ("click[description]", "click[< prev]", "click[features]", "click[< prev]", "click[< prev]",
                      "click[next >]", "click[< prev]", "click[nothing]"):
                r = timed(a, click_t)
            r = timed(products[1], click_t)
            r = timed("click[buy now]", click_t)
    all_t = search_t + click_t
    ms = 1000.0
    return {
        "steps": len(all_t),
        "step_ms_mean": statistics.fmean(all_t) * ms,
        "search_step_ms_mean": statistics.fmean(search_t) * ms,
        "click_step_ms_mean": statistics.fmean(click_t) * ms,
        "step_ms_p95": sorted(all_t)[int(0.95 * len(all_t))] * ms,
    }


def bench_search() -> dict:
    fx = read_jsonl(FIXTURES / "webshop_search_anserini_top50.jsonl.xz")
    index = wsenv.load_world().index
    for f in fx:  # warm the stem cache
        index.search(f["query"])
    lat = []
    overlap = top1 = same10 = same50 = 0
    for f in fx:
        t = time.perf_counter()
        got = index.search(f["query"], 50)
        lat.append(time.perf_counter() - t)
        want = f["top50"]
        overlap += len(set(got[:10]) & set(want[:10])) / max(1, min(10, len(want)))
        top1 += got[:1] == want[:1]
        same10 += got[:10] == want[:10]
        same50 += got == want
    n = len(fx)
    lat.sort()
    return {
        "queries": n,
        "query_ms_mean": statistics.fmean(lat) * 1000,
        "query_ms_p50": lat[n // 2] * 1000,
        "query_ms_p95": lat[int(0.95 * n)] * 1000,
        "top10_overlap": overlap / n,
        "top1_agreement": top1 / n,
        "same_top10_order": same10 / n,
        "same_top50_list": same50 / n,
    }


def bench_goals() -> dict:
    w = wsenv.load_world()
    fx = read_jsonl(FIXTURES / "webshop_synthetic_goals_seed233.jsonl.xz")
    equal = sum(
        f["asin"] == g.asin and f["instruction_text_without_price"] == g.base_text
        and f["attributes"] == list(g.attributes) and f["goal_options"] == g.goal_options
        for f, g in zip(fx, w.goals)
    )
    scores = []
    for i, g in enumerate(w.goals):
        pg = priced_goal(w.catalog, w.goals, i, 0)
        p = w.catalog.by_asin[g.asin]
        scores.append(get_reward(w.catalog, p, g, hidden_price(p, 0, i), pg.price_upper, dict(g.goal_options))[0])
    return {
        "goals": len(w.goals),
        "goals_equal_to_fixture_in_order": equal if len(fx) == len(w.goals) else -1,
        "fixture_goals": len(fx),
        "human_goals": len(w.human_goals),
        "oracle_below_1": sum(s < 1.0 for s in scores),
        "oracle_mean": statistics.fmean(scores),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--goals", type=int, default=100, help="test goals played in the step benchmark")
    args = ap.parse_args()
    out = {"startup": bench_startup(), "steps": bench_steps(args.goals), "search": bench_search(), "goals": bench_goals()}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    s, st, q, g = out["startup"], out["steps"], out["search"], out["goals"]
    print("WebShop (serl, in-process, no Java)")
    print(f"  start-up: world {s['world_load_s']:.2f} s; BM25 index build {s['index_build_s']:.2f} s, "
          f"from cache {s['index_from_cache_s']:.3f} s")
    print(f"  step time: {st['step_ms_mean']:.3f} ms mean over {st['steps']} steps (p95 {st['step_ms_p95']:.3f} ms); "
          f"search step {st['search_step_ms_mean']:.3f} ms, click step {st['click_step_ms_mean']:.3f} ms")
    print(f"  query latency (k=50, {q['queries']} queries): mean {q['query_ms_mean']:.3f} ms, "
          f"p50 {q['query_ms_p50']:.3f} ms, p95 {q['query_ms_p95']:.3f} ms")
    print(f"  search parity vs Anserini 0.22.1: top-10 overlap {q['top10_overlap']:.4f}, top-1 {q['top1_agreement']:.4f}, "
          f"same top-10 order {q['same_top10_order']:.4f}, same top-50 list {q['same_top50_list']:.4f}")
    print(f"  goal order: {g['goals_equal_to_fixture_in_order']}/{g['fixture_goals']} goals equal to the seed-233 "
          f"fixture ({g['goals']} synthetic, {g['human_goals']} human)")
    print(f"  oracle purchase: score < 1 on {g['oracle_below_1']} goals, mean {g['oracle_mean']:.4f}")


if __name__ == "__main__":
    main()
