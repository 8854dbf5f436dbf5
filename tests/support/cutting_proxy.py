#!/usr/bin/env python3
"""A TCP proxy on 127.0.0.1 that cuts answers short: of the connections it accepts, the 1st, 3rd,
5th ... (CUTS of them) have the server's answer stopped after AFTER bytes (the connection
closed, as a reset link or a dead load balancer leaves it); the others are forwarded whole. For
the S3 client's retry test.
  cutting_proxy.py UPSTREAM_PORT AFTER CUTS
Prints its port, then serves until killed."""
import socket, sys, threading

upstream, after, cuts = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
accepted = 0
lock = threading.Lock()


def pump(src, dst, limit):
    sent = 0
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if limit is not None and sent + len(data) >= limit:
                dst.sendall(data[:limit - sent])
                break
            dst.sendall(data)
            sent += len(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client):
    global cuts, accepted
    with lock:
        cut = accepted % 2 == 0 and cuts > 0
        accepted += 1
        cuts -= cut
    server = socket.create_connection(("127.0.0.1", upstream))
    threading.Thread(target=pump, args=(client, server, None), daemon=True).start()
    pump(server, client, after if cut else None)


listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
