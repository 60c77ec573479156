"""bench/serve/load.py URL CLIENTS REQUESTS MAX_TOKENS PROMPTS OUT: a bounded
load on an OpenAI-compatible server (mc-serve or llama.cpp's llama-server).

CLIENTS threads, each with its own keep-alive connection, send REQUESTS
completions in all (greedy, max_tokens MAX_TOKENS, the prompts of the file
PROMPTS, one a line, in turn), streamed, and time them: aggregate output
tokens/s (completion tokens counted by the server's usage, or by the
streamed chunks where it gives none) over the wall time from the first
request to the last answer, and the median time to the first token.
Standard library only. Writes a JSON summary to OUT and prints it.
"""
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

url, clients, total, max_tokens, prompts_file, out = sys.argv[1:7]
clients, total, max_tokens = int(clients), int(total), int(max_tokens)
prompts = [l.strip() for l in open(prompts_file) if l.strip()]
u = urllib.parse.urlparse(url)
lock = threading.Lock()
state = {"next": 0}
ttft, tokens, errors = [], [], []


def one(conn, prompt):
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        errors.append((r.status, r.read()[:200]))
        return
    first, chunks, usage = None, 0, None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            continue
        d = json.loads(data)
        if d.get("usage"):
            usage = d["usage"].get("completion_tokens")
        for ch in d.get("choices") or []:
            if ch.get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
    if r.will_close:
        conn.close()  # reconnects on the next request
    with lock:
        if first is not None:
            ttft.append(first)
        tokens.append(usage if usage is not None else chunks)


def worker(w):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    while True:
        with lock:
            i = state["next"]
            if i >= total:
                break
            state["next"] += 1
        try:
            one(conn, prompts[i % len(prompts)])
        except (http.client.HTTPException, OSError):
            # the server closed a kept-alive connection: once more, anew
            conn.close()
            one(conn, prompts[i % len(prompts)])
    conn.close()


t0 = time.perf_counter()
ts = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
for t in ts:
    t.start()
for t in ts:
    t.join()
wall = time.perf_counter() - t0
res = {"clients": clients, "requests": total, "errors": len(errors), "tokens": sum(tokens),
       "seconds": wall, "tokens_per_s": sum(tokens) / wall,
       "ttft_median_s": statistics.median(ttft) if ttft else None}
if errors:
    res["first_error"] = repr(errors[0])
json.dump(res, open(out, "w"))
print(json.dumps(res))
