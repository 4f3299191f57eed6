import csv, json, sys, functools
import numpy as np, jax, jax.numpy as jnp
from vtc_jax.servers import vllm_proto as vp
G = "/work/shared/vllm_golden/"
def load(name):
    cfg = json.load(open(G + name + ".config.json"))
    rows = list(csv.DictReader(open(G + name + ".csv")))
    gold = json.load(open(G + name + ".schedule.json"))
    return cfg, rows, gold
def run(name):
    cfg, rows, gold = load(name)
    c = vp.VllmConfig(block_size=cfg["block_size"], num_blocks=cfg["num_blocks"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
        chunked_prefill=cfg["chunked_prefill"], long_prefill_token_threshold=cfg["long_prefill_threshold"], policy=cfg["policy"])
    a = lambda k: jnp.asarray([int(r.get(k) or 0) for r in rows], jnp.int32)
    tr = vp.Trace(arrival=a("arrival"), prompt=a("prompt"), output=a("output"), priority=a("priority"), valid=jnp.ones(len(rows), bool))
    n = gold["num_steps"]
    @jax.jit
    def go(tr):
        s = vp.init(c, tr)
        return jax.lax.scan(lambda s, _: vp.step(c, tr, s), s, None, length=n)
    s, (t, sched, pre, fin) = go(tr)
    t, sched, pre, fin = map(np.asarray, (t, sched, pre, fin))
    mism = 0
    for i, st in enumerate(gold["steps"]):
        mine = {str(j): int(sched[i, j]) for j in np.nonzero(sched[i])[0]}
        mp = sorted(int(j) for j in np.nonzero(pre[i])[0])
        if st["step"] != int(t[i]) or st["sched"] != mine or sorted(st["preempted"]) != mp:
            print(name, "first mismatch at record", i, "gold", st, "mine", int(t[i]), mine, mp)
            mism = 1
            break
    return mism == 0
names = sys.argv[1:]
ok = [n for n in names if run(n)]
print("match", len(ok), "of", len(names), ok)
