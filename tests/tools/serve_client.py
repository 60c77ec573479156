"""serve_client.py - the clients of tests/tools/serve.bats: OpenAI's Python
package (and a raw socket where a client must misbehave) against mc-serve.

  serve_client.py URL complete PROMPT MAX [stream]   the completion's text (JSON string)
  serve_client.py URL chat TEXT MAX [stream]         a chat completion's content (JSON string)
  serve_client.py URL echo PROMPT                    the prompt's token log-probabilities (echo)
  serve_client.py URL specs N OUT                    N request specs (prompts, lengths, sampling)
  serve_client.py URL run SPECS OUT [concurrent]     run them one by one, or all at once
  serve_client.py URL hang PROMPT                    stream, read the first chunk, hang up
  serve_client.py URL usage PROMPT MAX               stream with include_usage: the usage
                                                     chunk's and the unstreamed response's usage
  serve_client.py URL load N PID OUT                 N short requests from 8 connections; the
                                                     server's RSS after the first 1,000 and at
                                                     the end, in OUT (JSON)
"""
import json
import socket
import sys
import threading
import urllib.parse

URL, MODE = sys.argv[1], sys.argv[2]
ARGS = sys.argv[3:]


def client():
    import openai
    return openai.OpenAI(base_url=URL + "/v1", api_key="none", max_retries=0, timeout=600)


def complete(c, prompt, max_tokens, stream=False, **kw):
    if stream:
        parts, lps = [], []
        for ch in c.completions.create(model="mc", prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True, **kw):
            parts.append(ch.choices[0].text)
            if ch.choices[0].logprobs:
                lps += ch.choices[0].logprobs.token_logprobs
        return "".join(parts), lps
    r = c.completions.create(model="mc", prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)
    lp = r.choices[0].logprobs
    return r.choices[0].text, (lp.token_logprobs if lp else [])


if MODE == "complete":
    text, _ = complete(client(), ARGS[0], int(ARGS[1]), len(ARGS) > 2)
    print(json.dumps(text))
elif MODE == "chat":
    c = client()
    msgs = [{"role": "user", "content": ARGS[0]}]
    if len(ARGS) > 2:
        text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="mc", messages=msgs, max_tokens=int(ARGS[1]), temperature=0, stream=True))
    else:
        r = c.chat.completions.create(model="mc", messages=msgs, max_tokens=int(ARGS[1]),
                                      temperature=0)
        text = r.choices[0].message.content
    print(json.dumps(text))
elif MODE == "echo":
    r = client().completions.create(model="mc", prompt=ARGS[0], max_tokens=1, temperature=0,
                                    echo=True, logprobs=0)
    print(json.dumps(r.choices[0].logprobs.token_logprobs[:r.usage.prompt_tokens]))
elif MODE == "specs":
    import random
    rnd = random.Random(5)
    words = ("the river list python function value under over a an of to in and time "
             "model token batch stream server").split()
    specs = []
    for i in range(int(ARGS[0])):
        prompt = " ".join(rnd.choice(words) for _ in range(1 + rnd.randrange(30)))
        s = {"prompt": prompt, "max_tokens": 1 + rnd.randrange(40), "logprobs": 1}
        if i % 3 == 1:
            s.update(temperature=1.1, top_p=0.9, seed=100 + i)
        elif i % 3 == 2:
            s.update(temperature=0.8, top_k=20, seed=7, stream=True)
        else:
            s.update(temperature=0)
        specs.append(s)
    json.dump(specs, open(ARGS[1], "w"))
elif MODE == "run":
    specs = json.load(open(ARGS[0]))
    c = client()
    out = [None] * len(specs)

    def one(i):
        s = dict(specs[i])
        stream = s.pop("stream", False)
        if "top_k" in s:
            s["extra_body"] = {"top_k": s.pop("top_k")}
        if stream:
            text, lps, toks, fin = "", [], [], None
            for ch in c.completions.create(model="mc", stream=True, **s):
                text += ch.choices[0].text
                if ch.choices[0].logprobs:
                    lps += ch.choices[0].logprobs.token_logprobs
                    toks += ch.choices[0].logprobs.tokens
                fin = ch.choices[0].finish_reason or fin
        else:
            r = c.completions.create(model="mc", **s)
            text, fin = r.choices[0].text, r.choices[0].finish_reason
            lps, toks = r.choices[0].logprobs.token_logprobs, r.choices[0].logprobs.tokens
        out[i] = {"text": text, "logprobs": lps, "tokens": toks, "finish": fin}

    if len(ARGS) > 2:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for i in range(len(specs)):
            one(i)
    json.dump(out, open(ARGS[1], "w"))
elif MODE == "hang":
    u = urllib.parse.urlparse(URL)
    s = socket.create_connection((u.hostname, u.port))
    body = json.dumps({"prompt": ARGS[0], "max_tokens": 100, "temperature": 0,
                       "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"data: " not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    s.close()
    print("first chunk" if b"data: " in got else "nothing")
elif MODE == "usage":
    c = client()
    chunks = list(c.completions.create(model="mc", prompt=ARGS[0], max_tokens=int(ARGS[1]),
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert all(ch.usage is None for ch in chunks[:-1]), chunks
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    text = "".join(ch.choices[0].text for ch in chunks[:-1])
    r = c.completions.create(model="mc", prompt=ARGS[0], max_tokens=int(ARGS[1]), temperature=0)
    assert text == r.choices[0].text, (text, r.choices[0].text)
    print(json.dumps([last.usage.model_dump(), r.usage.model_dump()]))
elif MODE == "load":
    import http.client
    n, pid = int(ARGS[0]), int(ARGS[1])
    u = urllib.parse.urlparse(URL)
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "bad": [], "rss": {}}

    def rss():
        for line in open("/proc/%d/status" % pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])

    def worker(w):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        while True:
            with lock:
                i = state["next"]
                if i >= n:
                    break
                state["next"] += 1
            words = ("the river list python function value under a of to in model "
                     "token").split()
            prompt = " ".join(words[(i * 7 + k) % len(words)] for k in range(1 + i % 23))
            if i % 4 == 3:
                path, body = "/v1/chat/completions", {"messages": [
                    {"role": "user", "content": prompt}], "max_tokens": 1 + i % 5}
            else:
                path, body = "/v1/completions", {"prompt": prompt, "max_tokens": 1 + i % 6,
                                                 "logprobs": i % 2}
            body.update(model="mc", temperature=(i % 3) * 0.5, seed=i, stream=i % 5 == 0)
            conn.request("POST", path, json.dumps(body),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            ok = r.status == 200
            with lock:
                if not ok:
                    state["bad"].append((i, r.status, data[:200].decode("latin-1")))
                state["done"] += 1
                if state["done"] == 1000:
                    state["rss"]["first_1000"] = rss()
        conn.close()

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    state["rss"]["end"] = rss()
    json.dump({"requests": state["done"], "bad": state["bad"][:5], "nbad": len(state["bad"]),
               "rss_kb": state["rss"]}, open(ARGS[2], "w"))
else:
    sys.exit("unknown mode " + MODE)
