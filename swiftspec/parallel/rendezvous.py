"""Meeting a peer on another host: the authenticated handshake that runs before any process group forms.

torch.distributed accepts any peer and sends plaintext, so the target host listens on the address it
is given (never 0.0.0.0 unless asked) and first runs a mutual HMAC challenge over a plain TCP
connection: each side proves it holds the shared secret (SWIFTSPEC_SECRET or --secret-file) and the
two compare protocol version, tokenizer digest and the tree settings that must agree. Only then does
the target open a TCPStore on a fresh port, under a random session prefix, which it names inside the
authenticated reply; both sides then form their process groups on that store. Traffic itself stays
unencrypted: tunnel it (ssh -L) where the network is not trusted.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import select
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from swiftspec.errors import UserError, link_errors

log = logging.getLogger(__name__)
PROTOCOL_VERSION = 2  # bump whenever distributed/protocol.py's messages or the handshake change
SECRET_ENV = "SWIFTSPEC_SECRET"
GLOO_IFNAME_ENV = "GLOO_SOCKET_IFNAME"
MAX_LINE = 4096  # a handshake line longer than this comes from no SwiftSpec peer
_PROBES = ("def check(pair):\n    return 'ok'  # ünï\n", "The quick brown fox 0123456789 <|endoftext|>",
           "  \t\n{}[]()=>;:.,!?'\"日本語 émoji 🙂")


class HandshakeRefused(UserError):
    """The peer failed the handshake, or this side refused it; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """What the two hosts must agree on before they link."""

    role: str  # "draft" (the connecting side) | "target"
    tokenizer: str  # tokenizer_digest()
    verify_size: int  # bs: the target sizes its verifier by it
    max_seq_len: int  # the draft's KV cache must hold every request the target takes
    version: int = PROTOCOL_VERSION

    def as_dict(self) -> dict:
        return {"role": self.role, "tokenizer": self.tokenizer, "verify_size": self.verify_size,
                "max_seq_len": self.max_seq_len, "version": self.version}

    def as_text(self) -> str:
        return f"{self.role}|{self.version}|{self.tokenizer}|{self.verify_size}|{self.max_seq_len}"


@dataclass(slots=True)
class Joined:
    """A linked peer: the store both sides form their groups on, and the limit on every message."""

    store: dist.Store
    timeout_s: float
    cores: list[int] | None = None  # this host's cores for its group (None: the engine's own plan)
    server: dist.Store | None = field(default=None, repr=False)  # the target's TCPStore (kept alive)


def read_secret(secret_file: str = "") -> bytes:
    """The shared secret: the first line of --secret-file, else $SWIFTSPEC_SECRET; one is required."""
    if secret_file:
        try:
            text = Path(secret_file).expanduser().read_text().strip()
        except OSError as exc:
            raise UserError(f"cannot read the secret file {secret_file}: {exc.strerror}") from None
    else:
        text = os.environ.get(SECRET_ENV, "").strip()
    if len(text) < 8:
        raise UserError(f"linking hosts needs a shared secret of at least 8 characters: set {SECRET_ENV} "
                        "or pass --secret-file (the same on both hosts)")
    return text.encode()


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) -> (host, port); the host is required, so nothing binds 0.0.0.0 unasked."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise UserError(f"--rendezvous wants HOST:PORT with a port in 0..65535 (0: any free port), got {text!r}")
    return host, int(port)


def tokenizer_digest(tokenizer) -> str:  # tokenizer: swiftspec.tokenizer.Tokenizer
    """A digest of how the tokenizer maps text to ids (and its end tokens): equal tokenizers agree."""
    h = hashlib.sha256()
    for probe in _PROBES:
        h.update(json.dumps(tokenizer.encode(probe)).encode())
    h.update(json.dumps(sorted(tokenizer.eos_token_ids)).encode())
    return h.hexdigest()[:16]


def _mac(secret: bytes, *parts: object) -> str:
    return hmac.new(secret, "|".join(str(p) for p in parts).encode(), hashlib.sha256).hexdigest()


def _send(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _recv(sock: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(MAX_LINE)
        if not chunk:
            raise HandshakeRefused("the peer closed the connection during the handshake")
        data += chunk
        if len(data) > MAX_LINE:
            raise HandshakeRefused("the peer sent no SwiftSpec handshake")
    try:
        obj = json.loads(data)
    except ValueError:
        raise HandshakeRefused("the peer sent no SwiftSpec handshake") from None
    if not isinstance(obj, dict):
        raise HandshakeRefused("the peer sent no SwiftSpec handshake")
    return obj


def mismatch(mine: Hello, theirs: Hello) -> str | None:
    """Why two hosts must not link (one line), or None when they agree."""
    if theirs.version != mine.version:
        return f"protocol version {theirs.version} at the draft host, {mine.version} at the target host: run one release"
    if theirs.role != "draft":
        return f"only a draft host may join a target host, not a {theirs.role!r} host"
    if theirs.tokenizer != mine.tokenizer:
        return "the draft model's tokenizer differs from the target's; pick a draft of the same family"
    if theirs.verify_size != mine.verify_size:
        return f"--verify-size {theirs.verify_size} at the draft host, {mine.verify_size} at the target host"
    if theirs.max_seq_len < mine.max_seq_len:
        return f"--max-seq-len {theirs.max_seq_len} at the draft host is below the target host's {mine.max_seq_len}"
    return None


def interface_of(address: str) -> str | None:
    """The name of the local network interface that holds `address` (IPv4), for gloo to bind to."""
    try:
        want = socket.inet_aton(address)
    except OSError:
        return None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                got = fcntl.ioctl(probe.fileno(), 0x8915, req)[20:24]  # SIOCGIFADDR
            except OSError:
                continue
            if got == want:
                return name
    finally:
        probe.close()
    return None


def bind_gloo_to(local_address: str) -> None:
    """gloo binds to the hostname's address by default, which may not reach the peer: bind it to the
    interface the handshake went out on, unless the user chose one ($GLOO_SOCKET_IFNAME)."""
    name = interface_of(local_address)
    if name and not os.environ.get(GLOO_IFNAME_ENV):
        os.environ[GLOO_IFNAME_ENV] = name


class Listener:
    """The target host's side: listen at the given address; each connection runs the handshake."""

    def __init__(self, address: str, secret: bytes, hello: Hello, timeout_s: float) -> None:
        self.host, port = parse_address(address)
        if ipaddress.ip_address(socket.gethostbyname(self.host)).is_unspecified:
            log.warning("rendezvous on %s: every interface accepts connections (the secret still guards it)",
                        self.host)
        self._secret, self._hello, self.timeout_s = secret, hello, timeout_s
        self._sock = socket.create_server((self.host, port), reuse_port=False)
        self.port = self._sock.getsockname()[1]
        bind_gloo_to(socket.gethostbyname(self.host))

    def pending(self, wait_s: float = 0.0) -> bool:
        """A peer is waiting to be accepted (waits up to wait_s)."""
        return bool(select.select([self._sock], [], [], max(0.0, wait_s))[0])

    def accept(self) -> Joined | None:
        """Run the handshake with the next peer; None (and a one-line warning) when it is refused."""
        conn, peer = self._sock.accept()
        conn.settimeout(self.timeout_s)
        try:
            with conn:
                return self._handshake(conn)
        except (HandshakeRefused, OSError) as exc:
            log.warning("refused a peer at %s: %s", peer[0], exc)
            return None

    def _handshake(self, conn: socket.socket) -> Joined:
        nonce = secrets.token_hex(16)
        _send(conn, {"swiftspec": self._hello.version, "nonce": nonce})
        msg = _recv(conn)
        try:
            theirs = Hello(**msg["hello"])
            their_nonce, their_mac = str(msg["nonce"]), str(msg["mac"])
        except (KeyError, TypeError):
            raise HandshakeRefused("the peer sent no SwiftSpec handshake") from None
        if not hmac.compare_digest(their_mac, _mac(self._secret, theirs.as_text(), nonce, their_nonce)):
            _send(conn, {"error": "the target host refused this host: wrong secret"})
            raise HandshakeRefused("wrong secret")
        if (why := mismatch(self._hello, theirs)) is not None:
            _send(conn, {"error": why})
            raise HandshakeRefused(why)
        with link_errors():
            server = dist.TCPStore(self.host, 0, 2, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=self.timeout_s))
        session = secrets.token_hex(16)
        _send(conn, {"hello": self._hello.as_dict(), "store_port": server.port, "session": session,
                     "mac": _mac(self._secret, self._hello.as_text(), their_nonce, nonce, server.port, session)})
        store = dist.PrefixStore(f"swiftspec/{session}/", server)
        return Joined(store=store, timeout_s=self.timeout_s, cores=sorted(os.sched_getaffinity(0)), server=server)

    def close(self) -> None:
        self._sock.close()


def connect(address: str, secret: bytes, hello: Hello, timeout_s: float) -> Joined:
    """The draft host's side: run the handshake with the target host and join its store. Raises
    OSError while nobody listens there yet (the caller retries) and HandshakeRefused on a refusal."""
    host, port = parse_address(address)
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        local = conn.getsockname()[0]
        first = _recv(conn)
        if "nonce" not in first:
            raise HandshakeRefused(f"{address} is no SwiftSpec target host")
        nonce, their_nonce = secrets.token_hex(16), str(first["nonce"])
        _send(conn, {"hello": hello.as_dict(), "nonce": nonce, "mac": _mac(secret, hello.as_text(), their_nonce, nonce)})
        reply = _recv(conn)
    if "error" in reply:
        raise HandshakeRefused(f"the target host refused to link: {reply['error']}")
    try:
        theirs = Hello(**reply["hello"])
        port_, session, their_mac = int(reply["store_port"]), str(reply["session"]), str(reply["mac"])
    except (KeyError, TypeError, ValueError):
        raise HandshakeRefused(f"{address} sent no SwiftSpec handshake") from None
    if not hmac.compare_digest(their_mac, _mac(secret, theirs.as_text(), nonce, their_nonce, port_, session)):
        raise HandshakeRefused("the target host did not prove the shared secret: refusing it")
    if theirs.tokenizer != hello.tokenizer:
        raise HandshakeRefused("the target model's tokenizer differs from this draft's; pick a draft of the same family")
    bind_gloo_to(local)
    with link_errors():
        server = dist.TCPStore(host, port_, 2, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    return Joined(store=dist.PrefixStore(f"swiftspec/{session}/", server), timeout_s=timeout_s, server=server)

