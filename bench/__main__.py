"""`./es bench`: every benchmark of docs/benchmarks.md, results in bench/results/<name>-<date>.*

  ./es bench                 the default suite (measured 2026-11-22 at a load of ~10: step
                             overhead 10 min, barrier 5, its floor 1, uneven 9, growth 3: about 28 minutes)
  ./es bench --full          + the 0.1M/10M MLPs, the CTR model, async with vs without the hooks,
                             start-up at 2/4/8 workers, the input's overhead, a mid-epoch
                             resume's skip and save, the work queue with a half-speed worker,
                             its synchronous steps on Zipf-sized files, the cost of a claim,
                             the elastic gate's and a lost worker's, asynchronous and
                             synchronous, with and without a spare (about 105 minutes more)
  ./es bench --only=barrier  one of: step_overhead, barrier, barrier_floor, uneven, growth,
                             sizes, ctr, async, startup_scaling, input_overhead, resume_cost,
                             save_stall, run_cost, work_queue, work_queue_sync, claim_cost,
                             step_runner_cost, queue_step_cost, elastic_gate, elastic_cost,
                             elastic_sync, elastic_sync_step, elastic_spare, elastic_spare_sync
                             (each is also `python -m bench.<module>` with its own flags)
  ./es bench --only=soak     opt-in only (never in --full): a sync and an async job of 100,000
                             steps each with mid-epoch saves (bench/soak.py; tens of minutes)
  ./es bench --only=scale    opt-in only: the ps-side protocol with 8 to 256 simulated workers
                             (bench/scale.py; its model to 1,000: python -m bench.scale_model)
  ./es bench --only=elastic_chaos  opt-in only: elastic jobs whose workers are killed, frozen
                             and relaunched at random, async and sync, 3 seeds (bench/elastic_chaos.py)

Each benchmark runs its compared variants alternately in one invocation (5 repetitions) and
writes a JSON (with the load average it ran under) and, where there is one, a PNG plot.
"""

import datetime
import os
import subprocess
import sys

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# name -> (module, args); {out} is bench/results/<name>-<date> (no extension).
_DEFAULT = {
    "step_overhead": ("bench.step_overhead", ["--workers=2,4", "--repetitions=5", "--steps=80",
                                              "--warmup=15", "--output={out}.json",
                                              "--plot={out}.png"]),
    "barrier": ("bench.barrier", ["--workers=2,4,8", "--repetitions=5", "--output={out}.json",
                                  "--plot={out}.png"]),
    "barrier_floor": ("bench.barrier_floor", ["--output={out}.json"]),
    "uneven": ("bench.uneven", ["--repetitions=5", "--output={out}.json", "--plot={out}.png"]),
    "growth": ("bench.growth", ["--output={out}.json", "--plot={out}.png"]),
}
_FULL = {
    "sizes": ("bench.step_overhead", ["--workers=2", "--repetitions=5", "--params=0.1M,10M",
                                      "--steps=60", "--warmup=10", "--output={out}.json",
                                      "--plot={out}.png"]),
    "ctr": ("bench.step_overhead", ["--workers=2", "--repetitions=5", "--model=ctr",
                                    "--num_ps=2", "--output={out}.json"]),
    "async": ("bench.step_overhead", ["--workers=2", "--repetitions=5",
                                      "--variants=async,async-hooks", "--output={out}.json"]),
    "startup_scaling": ("bench.startup_scaling", ["--workers=2,4,8", "--repetitions=5",
                                          "--output={out}.json", "--plot={out}.png"]),
    "input_overhead": ("bench.input_overhead", ["--output={out}.json"]),
    "queue_step_cost": ("bench.input_overhead", [
        "--variants=epoch_input,work_queue@25,work_queue@100,work_queue@400", "--steps=4000",
        "--repetitions=5", "--step_cpu_ms=26.22", "--output={out}.json"]),
    "resume_cost": ("bench.resume_cost", ["--output={out}.json"]),
    "save_stall": ("bench.save_stall", ["--output={out}.json"]),
    "run_cost": ("bench.run_cost", ["--output={out}.json"]),
    "work_queue": ("bench.work_queue", ["--repetitions=2", "--total_batches=1920",
                                        "--unit_batches=8,16", "--output={out}.json"]),
    "work_queue_sync": ("bench.work_queue_sync", ["--repetitions=3", "--output={out}.json"]),
    "claim_cost": ("bench.claim_cost", ["--claimers=2,8,32", "--output={out}.json"]),
    "step_runner_cost": ("bench.step_runner_cost", ["--output={out}.json"]),
    "elastic_gate": ("bench.input_overhead", [
        "--variants=epoch_input,work_queue@100,elastic_queue@100", "--steps=4000",
        "--repetitions=5", "--output={out}.json"]),
    "elastic_cost": ("bench.elastic_cost", ["--repetitions=7", "--output={out}.json"]),
    "elastic_sync": ("bench.elastic_cost", ["--sync", "--repetitions=5", "--output={out}.json"]),
    "elastic_sync_step": ("bench.elastic_cost", ["--sync", "--step_cost_only",
                                                 "--step_sleep_secs=0", "--repetitions=5",
                                                 "--output={out}.json"]),
    "elastic_spare": ("bench.elastic_cost", ["--spare_workers=1", "--repetitions=5",
                                             "--output={out}.json"]),
    "elastic_spare_sync": ("bench.elastic_cost", ["--sync", "--spare_workers=1",
                                                  "--repetitions=4", "--output={out}.json"]),
}
_OPT_IN = {  # --only=<name> runs these; never part of --full
    "soak": ("bench.soak", ["--output={out}.json"]),
    "elastic_chaos": ("bench.elastic_chaos", ["--seeds=0,1,2", "--output={out}.json"]),
    "scale": ("bench.scale", ["--workers=8,32,128,256", "--output={out}.json",
                              "--plot={out}.png"]),
}


def main(argv):
  full = "--full" in argv
  only = [a.split("=", 1)[1] for a in argv if a.startswith("--only=")]
  suite = dict(_DEFAULT, **_FULL) if full or only else dict(_DEFAULT)
  if only:
    suite.update(_OPT_IN)
  if only:
    unknown = [o for o in only if o not in suite]
    if unknown:
      sys.exit(f"unknown benchmark(s) {unknown}; choose from {', '.join(suite)}")
    suite = {k: v for k, v in suite.items() if k in only}
  os.makedirs(_RESULTS, exist_ok=True)
  date = datetime.date.today().isoformat()
  failed = []
  for name, (module, args) in suite.items():
    out = os.path.join(_RESULTS, f"{name}-{date}")
    command = [sys.executable, "-m", module] + [a.format(out=out) for a in args]
    print(f"\n=== {name}: {' '.join(command[1:])}  (load {os.getloadavg()[0]:.2f})", flush=True)
    if subprocess.call(command) != 0:
      failed.append(name)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
  main(sys.argv[1:])
