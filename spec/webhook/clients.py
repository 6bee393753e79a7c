#!/usr/bin/env python3
"""clients.py -- misbehaving webhook clients for spec/webhook/limits_spec.lua.

Loopback only; every mode is bounded in connections and time. Each mode
writes one JSON object to --out once it has done what it does (written to
OUT.tmp, then renamed), then holds its connections open until --hold
seconds have passed, then exits.

  idle    --n N [--src ADDR]
          N plain TCP connections that never send a byte. Reports
          {"opened": N, "closed_at_once": K}: how many the server closed
          within half a second (a per-address or total limit).
  watch   --n N [--src ADDR] --within S
          like idle, then waits up to S seconds for the server to close
          them all; reports {"opened", "closed", "seconds"} (the time from
          the last connect to the last close).
  dribble --interval S --within S [--stage headers|body]
          one TLS connection that sends a request one byte every S seconds
          (headers: the header block; body: a complete header block with
          Content-Length 64, then the body), until the server closes it or
          `within` passes; reports {"closed": bool, "seconds": t, "sent": n}.
  keepalive --requests N --interval S
          one TLS connection that POSTs a review to /validate N times, S
          seconds apart, reading each answer; reports {"answered": k, "error": e}
          (how many came back on the one connection, what ended it).
  bodies  --n N --size BYTES [--path /validate]
          N TLS connections, each sends headers declaring a body of BYTES
          bytes; those the server has not answered after a moment send all
          but the last byte. Reports {"opened": N, "refused": {status: count},
          "holding": H}.
"""
import argparse
import json
import os
import select
import socket
import ssl
import sys
import time


def out(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.rename(path + ".tmp", path)


def tcp(args, src):
    return socket.create_connection(("127.0.0.1", args.port), timeout=5, source_address=(src, 0))


def tls(args, src="127.0.0.1"):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    s = ctx.wrap_socket(tcp(args, src), server_hostname="localhost")
    return s


def closed(s):
    """True when the peer closed (or reset) the plain socket."""
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return False
    try:
        return s.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def hold(args, conns):
    end = time.time() + args.hold
    while time.time() < end:
        time.sleep(0.1)
    for c in conns:
        try:
            c.close()
        except OSError:
            pass


def idle(args):
    conns = [tcp(args, args.src) for _ in range(args.n)]
    time.sleep(0.5)
    out(args.out, {"opened": len(conns), "closed_at_once": sum(1 for c in conns if closed(c))})
    hold(args, conns)


def watch(args):
    conns = [tcp(args, args.src) for _ in range(args.n)]
    t0 = time.time()
    while time.time() - t0 < args.within and not all(closed(c) for c in conns):
        time.sleep(0.05)
    n = sum(1 for c in conns if closed(c))
    out(args.out, {"opened": len(conns), "closed": n, "seconds": time.time() - t0})
    hold(args, conns)


def dribble(args):
    head = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    if args.stage == "body":
        s = tls(args)
        s.sendall(head + b"Content-Length: 64\r\n\r\n")
        data = b"{" + b" " * 62 + b"}"
    else:
        s = tls(args)
        data = head + b"X-Slow: " + b"a" * 4096 + b"\r\n\r\n"
    t0, sent, gone = time.time(), 0, False
    s.settimeout(args.interval)
    while time.time() - t0 < args.within and sent < len(data):
        try:
            s.sendall(data[sent:sent + 1])
            sent += 1
            if s.recv(1) == b"":  # waits `interval` for the server to close
                gone = True
                break
        except socket.timeout:
            continue
        except (OSError, ssl.SSLError):
            gone = True
            break
    out(args.out, {"closed": gone, "seconds": time.time() - t0, "sent": sent})
    hold(args, [s])


def keepalive(args):
    body = (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
            b'"request":{"uid":"uid-keepalive","name":"vm-keepalive"}}')
    req = (b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    s = tls(args)
    s.settimeout(5)
    answered, error = 0, None
    for i in range(args.requests):
        if i:
            time.sleep(args.interval)
        try:
            s.sendall(req)
            data = b""
            while True:
                head, sep, rest = data.partition(b"\r\n\r\n")
                if sep:
                    n = [int(l.split(b":")[1]) for l in head.split(b"\r\n")
                         if l.lower().startswith(b"content-length:")]
                    if n and len(rest) >= n[0]:
                        break
                more = s.recv(4096)
                if not more:
                    raise ConnectionError("closed by the server")
                data += more
            if not data.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(data.split(b"\r\n")[0].decode())
            answered += 1
        except (OSError, ssl.SSLError) as e:
            error = "%s: %s" % (type(e).__name__, e)
            break
    out(args.out, {"answered": answered, "error": error})
    hold(args, [s])


def bodies(args):
    head = ("POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (args.path, args.size)).encode()
    conns = []
    for _ in range(args.n):
        s = tls(args)
        s.sendall(head)
        conns.append(s)
    time.sleep(0.5)  # refusals come right after the headers
    refused, holding = {}, []
    chunk = b" " * 65536
    for s in conns:
        r, _, _ = select.select([s], [], [], 0)
        if r or s.pending():
            try:
                line = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
            except (OSError, ssl.SSLError) as e:
                line = "error " + type(e).__name__
            status = line.split(" ")[1] if line.startswith("HTTP/") else line or "closed"
            refused[status] = refused.get(status, 0) + 1
            continue
        left = args.size - 1
        try:
            while left > 0:
                n = min(left, len(chunk))
                s.sendall(chunk[:n])
                left -= n
            holding.append(s)
        except (OSError, ssl.SSLError):
            refused["closed while sending"] = refused.get("closed while sending", 0) + 1
    out(args.out, {"opened": len(conns), "refused": refused, "holding": len(holding)})
    hold(args, conns)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["idle", "watch", "dribble", "keepalive", "bodies"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hold", type=float, default=30)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--src", default="127.0.0.1")
    p.add_argument("--within", type=float, default=10)
    p.add_argument("--interval", type=float, default=1)
    p.add_argument("--stage", default="headers", choices=["headers", "body"])
    p.add_argument("--size", type=int, default=3 * 1024 * 1024)
    p.add_argument("--path", default="/validate")
    p.add_argument("--requests", type=int, default=2)
    args = p.parse_args()
    if args.n > 64 or args.hold > 60 or args.within > 60:
        sys.exit("clients.py: bounded: at most 64 connections and 60 seconds")
    {"idle": idle, "watch": watch, "dribble": dribble, "keepalive": keepalive, "bodies": bodies}[args.mode](args)


if __name__ == "__main__":
    main()
