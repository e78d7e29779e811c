"""Load llama-server once per configuration and record its own memory accounting
(-lv 4) and the process's anon/file RSS after load. Nice'd; one process at a time."""
import itertools, json, os, re, signal, subprocess, sys, time
BIN = os.path.expanduser("~/.cache/localmodel-operator/llama-server/0.3.36-e3913aacb178/llama-server")
model, shape = sys.argv[1], sys.argv[2]
out = open(f"/work/notes/i45/acct-{shape}.jsonl", "a")
PAT = re.compile(r"(memory breakdown|Host  |CPU_REPACK|model buffer size|compute buffer size|output buffer size|llama_kv_cache: size|n_ctx_seq|KV buffer)")
for ctx, np_, (kv, fa) in itertools.product([4096, 8192, 16384, 32768], [1, 4],
                                            [("f16", "off"), ("f16", "on"), ("q8_0", "on")]):
    args = ["nice", "-n", "19", BIN, "-m", model, "-t", "1", "-c", str(ctx), "-np", str(np_),
            "-ctk", kv, "-ctv", kv, "-fa", fa, "--port", "18777", "--host", "127.0.0.1",
            "--no-webui", "-lv", "4"]
    t0 = time.time()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        if PAT.search(line):
            lines.append(line.strip())
        if "listening on" in line:
            break
    load_s = time.time() - t0
    time.sleep(1)
    roll = {}
    try:
        for l in open(f"/proc/{p.pid}/status"):
            if l.startswith(("RssAnon", "RssFile", "RssShmem", "VmRSS")):
                k, v = l.split(":"); roll[k] = int(v.split()[0]) // 1024
    except OSError:
        pass
    p.send_signal(signal.SIGTERM)
    for line in p.stdout:
        if PAT.search(line):
            lines.append(line.strip())
    try: p.wait(30)
    except subprocess.TimeoutExpired: p.kill(); p.wait()
    rec = dict(shape=shape, ctx=ctx, slots=np_, kv=kv, fa=fa, load_s=round(load_s, 1), rss_mib=roll, lines=lines)
    out.write(json.dumps(rec) + "\n"); out.flush()
    print(shape, ctx, np_, kv, fa, round(load_s, 1), roll, flush=True)
