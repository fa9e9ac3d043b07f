#!/usr/bin/env python3
"""The egress recorder: holds the loopback-only namespace open and writes down every attempt to leave it.

    unshare -n python egress.py --parent PID --log FILE

Run as the namespace's first process (tests/fakes/netns.py starts it). It:

1. brings `lo` up and makes *every* address local (`ip route add local 0.0.0.0/0 dev lo`,
   and `::/0` for IPv6), so that a packet to any address goes out on `lo`, where it is seen,
   instead of failing unseen with ENETUNREACH;
2. watches `lo` with a packet socket and logs each TCP SYN and each UDP datagram (but DNS,
   see 3) whose destination is not loopback (`{"kind": "tcp"|"udp", "address": ..., "port": ...}`); with
   no listener there, the kernel answers a SYN with a reset at once, so the attempt fails
   fast (ECONNREFUSED) and nothing leaves the machine;
3. answers DNS on port 53 of every address (the system's nameserver included, whatever
   resolv.conf names) with NXDOMAIN and logs each queried name (`{"kind": "dns", "name":
   ..., "type": "A"|"AAAA"|..., "server": ...}`), so a lookup fails at once and is named.

It prints `up` when all of that is in place and exits when its parent does (a killed test
run leaves no namespace behind). One JSON object a line in FILE. Standard library only.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import select
import socket
import struct
import subprocess
import sys

ETH_P_ALL = 0x0003
ETH_HEADER = 14  # lo frames carry an all-zero Ethernet header
PACKET_OUTGOING = 4  # a packet socket sees a frame on lo twice: once sent, once received
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux's value where Python lacks the name
DNS_PORT = 53
QTYPES = {1: "A", 28: "AAAA", 5: "CNAME", 12: "PTR", 15: "MX", 16: "TXT", 33: "SRV", 65: "HTTPS"}
WATCH_S = 1.0  # s between looks at the parent


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


# ---------------------------------------------------------------------------
# What a frame on lo is (pure)


def attempt(frame: bytes) -> dict | None:
    """The TCP connection attempt (SYN) or UDP datagram in an lo frame to a non-loopback address, or None."""
    kind = struct.unpack("!H", frame[12:14])[0]
    packet = frame[ETH_HEADER:]
    if kind == 0x0800 and len(packet) >= 20:
        header = (packet[0] & 0x0F) * 4
        proto, address = packet[9], socket.inet_ntop(socket.AF_INET, packet[16:20])
    elif kind == 0x86DD and len(packet) >= 40:
        header, proto, address = 40, packet[6], socket.inet_ntop(socket.AF_INET6, packet[24:40])
    else:
        return None
    segment = packet[header:]
    if proto not in (6, 17) or len(segment) < 4 or loopback(address):
        return None
    source, port = struct.unpack("!HH", segment[:4])
    if proto == 6:
        flags = segment[13] if len(segment) > 13 else 0
        if not (flags & 0x02) or flags & 0x10:  # a SYN without ACK opens a connection
            return None
        return {"kind": "tcp", "address": address, "port": port}
    if DNS_PORT in (source, port):  # a lookup, or our answer to one: the DNS socket logs those
        return None
    return {"kind": "udp", "address": address, "port": port}


def dns_question(data: bytes) -> tuple[str, str] | None:
    """(name, type) of a DNS query, or None when it is not one."""
    if len(data) < 12 or data[2] & 0x80:
        return None
    labels, i = [], 12
    while i < len(data) and data[i]:
        size = data[i]
        labels.append(data[i + 1:i + 1 + size].decode("ascii", errors="replace"))
        i += 1 + size
    if i + 5 > len(data):
        return None
    qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
    return ".".join(labels).lower(), QTYPES.get(qtype, str(qtype))


def nxdomain(query: bytes) -> bytes:
    """The answer to query: the same id and question, no such name."""
    end = 12
    while end < len(query) and query[end]:
        end += 1 + query[end]
    question = query[12:end + 5]
    flags = 0x8180 | (query[2] & 0x01) << 8 | 3  # response, recursion desired as asked, available; NXDOMAIN
    return query[:2] + struct.pack("!HHHHH", flags, 1, 0, 0, 0) + question


# ---------------------------------------------------------------------------
# The namespace's set-up and the loop


def setup_routes() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo"], check=True)
    # IPv6 may be off in the namespace: then there is nothing to reach over it either.
    subprocess.run(["ip", "-6", "route", "add", "local", "::/0", "dev", "lo"], capture_output=True)


def dns_sockets() -> list[socket.socket]:
    """UDP port 53 on every address; the destination of each query comes with it (pktinfo)."""
    v4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    v4.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    v4.bind(("0.0.0.0", DNS_PORT))
    found = [v4]
    try:
        v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
        v6.bind(("::", DNS_PORT))
        found.append(v6)
    except OSError:
        pass  # no IPv6 here
    return found


def answer(sock: socket.socket, log) -> None:
    """Log one query's name and answer NXDOMAIN from the address it was sent to (else the client drops it)."""
    data, ancillary, _, peer = sock.recvmsg(4096, 256)
    server, info = None, b""
    for level, kind, value in ancillary:
        if level == socket.IPPROTO_IP and kind == IP_PKTINFO:
            server, info = socket.inet_ntop(socket.AF_INET, value[8:12]), value
        elif level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO:
            server, info = socket.inet_ntop(socket.AF_INET6, value[:16]), value
    question = dns_question(data)
    if question is None:  # something else sent to port 53
        write(log, {"kind": "udp", "address": server, "port": DNS_PORT})
        return
    write(log, {"kind": "dns", "name": question[0], "type": question[1], "server": server})
    if sock.family == socket.AF_INET:  # in_pktinfo: ifindex, spec_dst (our source), addr
        control = [(socket.IPPROTO_IP, IP_PKTINFO, info[:4] + info[8:12] + info[8:12])]
    else:
        control = [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, info)]
    sock.sendmsg([nxdomain(data)], control, 0, peer)


def write(log, entry: dict) -> None:
    log.write(json.dumps(entry) + "\n")
    log.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    setup_routes()
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sniffer.bind(("lo", 0))
    dns = dns_sockets()
    with open(args.log, "a") as log:
        print("up", flush=True)
        while os.getppid() == args.parent:
            ready, _, _ = select.select([sniffer, *dns], [], [], WATCH_S)
            for sock in ready:
                if sock is sniffer:
                    frame, where = sniffer.recvfrom(65535)
                    seen = attempt(frame) if where[2] == PACKET_OUTGOING else None
                    if seen:
                        write(log, seen)
                else:
                    answer(sock, log)
    sys.exit(0)


if __name__ == "__main__":
    main()
