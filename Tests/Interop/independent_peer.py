#!/usr/bin/env python3
"""An independent PeerLink peer (link protocol v2), written from the project's articles alone:
WireFormat (preface, Noise XX handshake, hello, records, frames, sequenced frames and ACK,
streams and their credit, control messages), Sessions (invitations, MEMBERS, JOIN, the
automatic session id), Files (the resource protocol) and Architecture (fingerprints). It shares no code with PeerLink; the integration tests
(IndependentPeerTests) chat with `peerlink chat` through it, so an article and the code that
disagree fail a test. Needs the `noiseprotocol` package (and `cryptography`, which it pulls in);
Hardware/setup.sh --tests provides a python3 with both.

  independent_peer.py --listen 127.0.0.1:PORT [options]   # `peerlink chat --connect tcp://...` dials us
  independent_peer.py --dial   127.0.0.1:PORT [options]   # we dial chat's listener

PORT 0 listens on a free port; the line "listening on 127.0.0.1:N" says which.
Options: --name NAME, --service SVC (chat's default: peerlink), --encryption none|optional|required,
  --versions 2 [3 ...], --say TEXT (repeatable; sent as reliable MESSAGEs once the pair is connected),
  --reply (answer every message received with "echo: ..."),
  --linger SECONDS (after the last --say / reply, how long to stay before GO_AWAY 0),
  --invite (we invite instead of waiting for an INVITE), --decline (decline an INVITE),
  --auto / --session-id HEX (our session id: the automatic one of --service, or given),
  --session-field (put our session id, hello field 2, in the hello), --no-incarnation,
  --act SECONDS:ACTION (repeatable; act or misbehave on purpose, see do_action, e.g.
  sendfile=PATH offers a file; a file offered to us is accepted and checked), --act2 (the
  same, for later links), --early (count --act from the handshake, e.g. for "join"), --links N
  with the "drop" action (carry the pair over to a new link), --restart-on-relink (new incarnation),
  --bad magic|verdict|prologue|noname|longname|ctrlname|dupfield|inc0|unknownfield|cutfield|payload1.
Everything received is printed, frame by frame, on standard output. Traffic goes to 127.0.0.1 only.
"""
import argparse, base64, hashlib, os, select, socket, struct, sys, time

from noise.connection import NoiseConnection, Keypair
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives import serialization

# ---------------------------------------------------------------- constants (WireFormat.md)
MAGIC = b"PLNK"
VERSION = 2
ENC = {"none": 0, "optional": 1, "required": 2}
PROLOGUE_LABEL = b"PeerLink link v1"   # "prologue = "PeerLink link v1" || dialer's preface || listener's preface"

T_DATA, T_WINDOW_UPDATE, T_PING, T_GO_AWAY, T_CONTROL, T_MESSAGE, T_DATAGRAM, T_ACK = range(8)
TYPE_NAMES = ["DATA", "WINDOW_UPDATE", "PING", "GO_AWAY", "CONTROL", "MESSAGE", "DATAGRAM", "ACK"]
SEQUENCED = {T_DATA, T_WINDOW_UPDATE, T_MESSAGE}
F_SYN, F_ACK, F_FIN, F_RST, F_MORE = 0x1, 0x2, 0x4, 0x8, 0x10

C_INVITE, C_ACCEPT, C_DECLINE, C_MEMBERS, C_JOIN, C_LEAVE = range(1, 7)

# Files.md, The resource protocol: a stream named peerlink.resource carrying messages of a type
# byte, a u32 body length (at most 262144) and the body.
RESOURCE_STREAM = b"peerlink.resource"
R_OFFER, R_ACCEPT, R_DECLINE, R_DATA, R_VERDICT, R_CANCEL = range(1, 7)
R_NAMES = {1: "OFFER", 2: "ACCEPT", 3: "DECLINE", 4: "DATA", 5: "VERDICT", 6: "CANCEL"}
INITIAL_WINDOW = 256 * 1024     # WireFormat.md, Streams: each direction starts with 256 KiB
MAX_FRAME = 16384
CTRL_NAMES = {1: "INVITE", 2: "ACCEPT", 3: "DECLINE", 4: "MEMBERS", 5: "JOIN", 6: "LEAVE"}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def fingerprint(pub: bytes) -> str:
    """Architecture.md, Identity: first 80 bits of SHA-256(key), lowercase base32 (16 chars)."""
    return base64.b32encode(hashlib.sha256(pub).digest()[:10]).decode().lower()


def automatic_session_id(service: str) -> bytes:
    """Sessions.md, Automatic mode: SHA-256("PeerLink automatic session v1" || 0x00 || service)[:16]."""
    return hashlib.sha256(b"PeerLink automatic session v1\x00" + service.encode()).digest()[:16]


def fmt_fp(fp: str) -> str:
    return "-".join(fp[i:i + 4] for i in range(0, 16, 4))


# ---------------------------------------------------------------- socket helpers
class Closed(Exception):
    pass


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise Closed(f"link ended after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


# ---------------------------------------------------------------- preface (section 1)
def make_preface(enc: int, service: str, versions=(VERSION,), magic=MAGIC) -> bytes:
    s = service.encode()
    return magic + bytes([len(versions)]) + bytes(versions) + bytes([enc, len(s)]) + s


def read_preface(sock):
    raw = read_exact(sock, 5)
    magic, count = raw[:4], raw[4]
    versions = read_exact(sock, count)
    enc, slen = read_exact(sock, 2)
    service = read_exact(sock, slen)
    raw += versions + bytes([enc, slen]) + service
    return raw, dict(magic=magic, versions=list(versions), enc=enc, service=service.decode(errors="replace"))


def read_verdict(sock):
    v = read_exact(sock, 1)[0]
    if v == 0:
        return 0, ""
    (n,) = struct.unpack(">H", read_exact(sock, 2))
    return v, read_exact(sock, n).decode(errors="replace")


def encryption_on(a: int, b: int):
    """The table in section 1: None means refused (code 4)."""
    if {a, b} == {0, 2}:
        return None
    return not (a == 0 or b == 0)


# ---------------------------------------------------------------- hello (section 2)
def make_hello(name: str, session: bytes = None, incarnation: bytes = None) -> bytes:
    out = b""
    def field(t, v):
        return bytes([t]) + struct.pack(">H", len(v)) + v
    out += field(1, name.encode())
    if session is not None:
        out += field(2, session)
    if incarnation is not None:
        out += field(3, incarnation)
    return out


def parse_hello(b: bytes) -> dict:
    fields, i = {}, 0
    while i < len(b):
        t = b[i]
        (n,) = struct.unpack(">H", b[i + 1:i + 3])
        fields[t] = b[i + 3:i + 3 + n]
        i += 3 + n
    return {"name": fields.get(1, b"").decode(errors="replace"),
            "session": fields.get(2, b"").hex() or None,
            "incarnation": fields.get(3, b"").hex() or None,
            "other_fields": sorted(k for k in fields if k not in (1, 2, 3))}


# ---------------------------------------------------------------- frames (section 3)
def encode_frame(ftype, payload=b"", flags=0, stream=0, seq=None) -> bytes:
    h = struct.pack(">BBHII", VERSION, ftype, flags, stream, len(payload))
    if ftype in SEQUENCED:
        h += struct.pack(">Q", seq)
    return h + payload


def decode_frames(rec: bytes):
    frames, i = [], 0
    while i < len(rec):
        ver, ftype, flags, stream, length = struct.unpack(">BBHII", rec[i:i + 12])
        i += 12
        seq = None
        if ftype in SEQUENCED:
            (seq,) = struct.unpack(">Q", rec[i:i + 8])
            i += 8
        payload = rec[i:i + length]
        if len(payload) != length:
            raise ValueError("frame cut short")
        i += length
        frames.append(dict(ver=ver, type=ftype, flags=flags, stream=stream, seq=seq, payload=payload))
    return frames


def describe_control(p: bytes) -> str:
    ct = p[0]
    name = CTRL_NAMES.get(ct, f"?{ct}")
    f = p[1:]
    if ct == C_INVITE:
        iid, sid, tmo = struct.unpack(">I16sI", f[:24])
        return f"INVITE id={iid} session={sid.hex()} timeout={tmo}ms context={f[24:]!r}"
    if ct == C_ACCEPT:
        return f"ACCEPT id={struct.unpack('>I', f)[0]}"
    if ct == C_DECLINE:
        return f"DECLINE id={struct.unpack('>I', f[:4])[0]} reason={f[4]}"
    if ct == C_MEMBERS:
        sid, count = f[:16], f[16]
        i, members = 17, []
        for _ in range(count):
            fp = f[i:i + 16].decode(); n = f[i + 16]; nm = f[i + 17:i + 17 + n].decode(errors="replace")
            members.append((fp, nm)); i += 17 + n
        return f"MEMBERS session={sid.hex()} members={members}"
    if ct in (C_JOIN, C_LEAVE):
        return f"{name} session={f.hex()}"
    return f"{name} {f.hex()}"


def resource_message(rtype: int, body: bytes = b"") -> bytes:
    return bytes([rtype]) + struct.pack(">I", len(body)) + body


def transfer_id(sha: bytes, size: int, name: bytes) -> bytes:
    """Files.md, Transfer IDs: SHA-256("peerlink.resource" || SHA-256 || size u64 || name)[:16]."""
    return hashlib.sha256(RESOURCE_STREAM + sha + struct.pack(">Q", size) + name).digest()[:16]


class ResourceStream:
    """One stream of the resource protocol, either direction (Files.md)."""

    def __init__(self, sid, sending, path=None):
        self.sid = sid
        self.sending = sending
        self.inbox = b""              # resource-protocol bytes received, not parsed yet
        self.credit = INITIAL_WINDOW  # what we may still send on it
        self.consumed = 0             # bytes we took since our last WINDOW_UPDATE
        self.finished = False
        if sending:
            with open(path, "rb") as f:
                self.data = f.read()
            self.name = os.path.basename(path).encode()
            self.offset = None        # set by the receiver's ACCEPT
        else:
            self.expected = None
            self.received = b""

    def messages(self):
        while len(self.inbox) >= 5:
            rtype = self.inbox[0]
            (n,) = struct.unpack(">I", self.inbox[1:5])
            if len(self.inbox) < 5 + n:
                return
            body = self.inbox[5:5 + n]
            self.inbox = self.inbox[5 + n:]
            yield rtype, body


# ---------------------------------------------------------------- the peer
class Peer:
    def __init__(self, args):
        self.a = args
        self.priv = X25519PrivateKey.generate()
        self.priv_bytes = self.priv.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                  serialization.NoEncryption())
        self.pub = self.priv.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.fp = fingerprint(self.pub)
        self.incarnation = os.urandom(8)
        # Sessions.md: "A peer starts with one of its own (random)."
        if args.session_id:
            self.session = bytes.fromhex(args.session_id)
        elif args.auto:
            self.session = automatic_session_id(args.service)
        else:
            self.session = os.urandom(16)
        self.out_seq = 0          # last sequence number we sent
        self.kept = []            # (seq, encoded frame) sent but not acknowledged yet
        self.no_ack = False       # stop acknowledging (so the peer must keep its frames)
        self.phantom = False      # keep the next sequenced frames without writing them (as if lost)
        self.in_seq = 0           # last sequence number we took
        self.ack_owed = False
        self.ack_due = None
        self.next_msg_id = 1
        self.partial = {}         # message id -> bytes
        self.last_sent = time.monotonic()
        self.last_recv = time.monotonic()
        self.connected = False
        self.said = False
        self.done_at = None
        self.peer_name = "?"
        self.sent_join = False
        self.silent = False       # stop sending anything (keep-alive test)
        self.actions = []         # (time, action) scheduled once connected
        self.resources = {}       # stream id -> ResourceStream
        self.last_opened = 0      # the last stream id we opened
        log(f"our fingerprint {fmt_fp(self.fp)}  incarnation {self.incarnation.hex()}")

    # -- link setup -------------------------------------------------------
    def run(self):
        """One or more links in turn (--links N); what belongs to the pair (sequence numbers,
        kept frames, session) outlives each link, as WireFormat.md's *Sequenced frames* says."""
        a = self.a
        host, port = a.listen or a.dial
        ls = None
        if a.listen:
            ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((host, int(port))); ls.listen(4)
            ls.settimeout(a.accept_timeout)
            log(f"listening on {host}:{ls.getsockname()[1]}")
        for k in range(a.links):
            if k > 0 and a.restart_on_relink:
                # a new run of this peer: new incarnation, numbering starts again
                self.incarnation = os.urandom(8)
                self.out_seq = self.in_seq = 0; self.kept = []; self.next_msg_id = 1
                self.connected = False; self.sent_join = False
                log(f"*** restarted: new incarnation {self.incarnation.hex()}")
            if ls:
                self.sock, addr = ls.accept()
                self.dialer = False
                log(f"accepted link #{k + 1} from {addr}")
            else:
                self.sock = socket.create_connection((host, int(port)))
                self.dialer = True
                log(f"dialled {host}:{port} (link #{k + 1})")
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.last_recv = self.last_sent = time.monotonic()
            self.dropped = False
            self.link_scheduled = False
            try:
                self.preface_and_handshake()
                if self.a.early and k == 0:
                    self.schedule()
                if k > 0:
                    self.link_started_again()
                    if self.connected:
                        self.schedule()
                self.loop()
            except Closed as e:
                log(f"LINK ENDED: {e}")
            finally:
                self.sock.close()
            if not self.dropped:
                break
        if ls:
            ls.close()

    def link_started_again(self):
        """A new link carries the pair: ACK at once, then every kept frame again, in order."""
        log(f"  -> ACK {self.in_seq} (link start) and {len(self.kept)} kept frame(s) again")
        self.send_frames([self.ack_frame()])
        for seq, frame in self.kept:
            log(f"  -> (again) seq={seq} {frame[:40]!r}")
            self.send_frames([frame], keep=False)

    def preface_and_handshake(self):
        a, s = self.a, self.sock
        versions = tuple(a.versions)
        mine = make_preface(ENC[a.encryption], a.service, versions,
                            magic=b"PLNX" if a.bad == "magic" else MAGIC)
        # 1. Preface: "Both sides send their preface at once, without waiting for the other's"
        s.sendall(mine)
        theirs_raw, theirs = read_preface(s)
        log(f"PREFACE from peer: {theirs}  raw={theirs_raw.hex()}")
        # our verdict
        verdict = 0
        on = encryption_on(ENC[a.encryption], theirs["enc"])
        if theirs["magic"] != MAGIC: verdict, why = 1, "bad magic"
        elif VERSION not in theirs["versions"]: verdict, why = 2, "this peer speaks PeerLink protocol versions 2"
        elif theirs["service"] != a.service: verdict, why = 3, "service type mismatch"
        elif on is None: verdict, why = 4, "encryption required by one side and refused by the other"
        if a.bad == "verdict":
            verdict, why = 3, "testing a refusal verdict"
        if verdict:
            r = why.encode()
            s.sendall(bytes([verdict]) + struct.pack(">H", len(r)) + r)
        else:
            s.sendall(b"\x00")
        pv, preason = read_verdict(s)
        log(f"VERDICT from peer: {pv} {preason!r}; our verdict {verdict}")
        if verdict or pv:
            raise Closed("refused at the preface")
        self.encrypted = on
        log(f"encryption on this link: {'on' if on else 'off'}")

        # 2. Handshake: Noise XX, dialer = initiator; prologue binds both prefaces.
        dialer_pre, listener_pre = (mine, theirs_raw) if self.dialer else (theirs_raw, mine)
        prologue = PROLOGUE_LABEL + dialer_pre + listener_pre
        if a.bad == "prologue":
            prologue = b"PeerLink link v2" + dialer_pre + listener_pre
        n = NoiseConnection.from_name(b"Noise_XX_25519_ChaChaPoly_SHA256")
        n.set_as_initiator() if self.dialer else n.set_as_responder()
        n.set_keypair_from_private_bytes(Keypair.STATIC, self.priv_bytes)
        n.set_prologue(prologue)
        n.start_handshake()
        hs = n.noise_protocol.handshake_state   # kept to read the remote static key afterwards
        hello = make_hello(a.name if a.bad != "noname" else "",
                           self.session if a.session_field else None,
                           None if a.no_incarnation else self.incarnation)
        if a.bad == "noname":
            hello = hello[3:]   # drop the (empty) display-name field entirely
        elif a.bad == "longname":
            hello = make_hello("x" * 64, None, self.incarnation)
        elif a.bad == "ctrlname":
            hello = make_hello("tab\there", None, self.incarnation)
        elif a.bad == "dupfield":
            hello = make_hello(a.name, None, self.incarnation) + make_hello("again")
        elif a.bad == "inc0":
            hello = make_hello(a.name, None, bytes(8))
        elif a.bad == "unknownfield":
            hello = make_hello(a.name, None, self.incarnation) + bytes([99, 0, 3]) + b"abc"
        elif a.bad == "cutfield":
            hello = make_hello(a.name, None, self.incarnation) + bytes([3, 0, 8]) + b"abc"
        elif a.bad == "payload1":   # message 1 (dialer only) with a payload: "a listener ignores one"
            pass

        def send_hs(m):
            s.sendall(struct.pack(">H", len(m)) + bytes(m))

        def recv_hs():
            (ln,) = struct.unpack(">H", read_exact(s, 2))
            return read_exact(s, ln)

        if self.dialer:
            send_hs(n.write_message(b"ignored?" if a.bad == "payload1" else b""))   # -> e
            peer_hello = n.read_message(recv_hs())              # <- e, ee, s, es + listener's hello
            send_hs(n.write_message(hello))                     # -> s, se + dialer's hello
        else:
            m1 = n.read_message(recv_hs())
            log(f"handshake msg1 payload: {bytes(m1)!r}")
            send_hs(n.write_message(hello))
            peer_hello = n.read_message(recv_hs())
        assert n.handshake_finished
        self.noise = n
        self.peer_pub = hs.rs.public_bytes
        self.peer_fp = fingerprint(self.peer_pub)
        h = parse_hello(bytes(peer_hello))
        self.peer_name = h["name"]
        log(f"handshake hash {bytes(n.get_handshake_hash()).hex()}")
        log(f"HANDSHAKE done. peer key {self.peer_pub.hex()} fingerprint {fmt_fp(self.peer_fp)} hello={h}")
        log(f"fingerprint order: ours {'<' if self.fp < self.peer_fp else '>'} theirs")

    # -- records ----------------------------------------------------------
    def send_frames(self, frames, keep=True):
        if keep:
            for fr in frames:
                if len(fr) >= 20 and fr[1] in SEQUENCED:
                    self.kept.append((struct.unpack(">Q", fr[12:20])[0], fr))
        if self.phantom:
            frames = [fr for fr in frames if fr[1] not in SEQUENCED]
            if not frames:
                log("   (written nowhere: kept only, as if the link lost it)")
                return
        rec = b"".join(frames)
        if self.encrypted:
            rec = self.noise.encrypt(rec)
        self.sock.sendall(struct.pack(">H", len(rec)) + rec)
        self.last_sent = time.monotonic()

    def send(self, ftype, payload=b"", flags=0, stream=0):
        """Send one frame (sequenced ones get the next number); an owed ACK rides along."""
        frames = []
        seq = None
        if ftype in SEQUENCED:
            self.out_seq += 1
            seq = self.out_seq
        frames.append(encode_frame(ftype, payload, flags, stream, seq))
        if self.ack_owed and ftype != T_ACK and not self.no_ack:
            frames.append(self.ack_frame())
        extra = f" seq={seq}" if seq else ""
        log(f"  -> {TYPE_NAMES[ftype]} flags={flags:#x} stream={stream}{extra} payload={payload[:80]!r}")
        self.send_frames(frames)

    def ack_frame(self):
        self.ack_owed = False
        self.ack_due = None
        return encode_frame(T_ACK, struct.pack(">Q", self.in_seq))

    def send_control(self, ct, fields=b""):
        log(f"  -> CONTROL {describe_control(bytes([ct]) + fields)}")
        self.send_frames([encode_frame(T_CONTROL, bytes([ct]) + fields)] +
                         ([self.ack_frame()] if self.ack_owed else []))
        self.last_sent = time.monotonic()

    def send_message(self, text: str):
        data = text.encode()
        mid = self.next_msg_id; self.next_msg_id += 1
        chunks = [data[i:i + 16384] for i in range(0, len(data), 16384)] or [b""]
        for k, c in enumerate(chunks):
            self.send(T_MESSAGE, c, F_MORE if k < len(chunks) - 1 else 0, mid)

    def recv_record(self):
        (ln,) = struct.unpack(">H", read_exact(self.sock, 2))
        rec = read_exact(self.sock, ln)
        self.last_recv = time.monotonic()
        if self.encrypted:
            rec = self.noise.decrypt(rec)
        return bytes(rec)

    # -- the main loop ----------------------------------------------------
    def loop(self):
        a = self.a
        start = time.monotonic()
        if a.invite:
            # We invite the CLI (Sessions.md, Invitations): INVITE id, session, timeout ms, context.
            self.send_control(C_INVITE, struct.pack(">I16sI", 1, self.session, 30000) + b"")
        while True:
            now = time.monotonic()
            # keep-alive: "A side that has sent nothing for 2 s sends a PING"
            while self.actions and self.actions[0][0] <= now:
                _, act = self.actions.pop(0)
                if self.do_action(act):
                    return
            if now - self.last_sent >= 2.0 and not self.silent:
                self.send(T_PING, os.urandom(8), F_SYN)
            if self.ack_due is not None and now >= self.ack_due and not self.no_ack:
                log(f"  -> ACK {self.in_seq}")
                self.send_frames([self.ack_frame()])
            if now - self.last_recv > 8.0:
                self.goaway(8, "keep-alive timeout")
                return
            if self.done_at is not None and now >= self.done_at:
                self.goaway(0, "bye")
                return
            if now - start > a.max_time:
                self.goaway(0, "max time reached")
                return
            self.pump_files()
            r, _, _ = select.select([self.sock], [], [], 0.05)
            if not r:
                continue
            rec = self.recv_record()
            frames = decode_frames(rec)
            if len(frames) > 1:
                log(f"(record of {len(frames)} frames)")
            for f in frames:
                if self.handle(f):
                    return

    def do_action(self, act):
        """Deliberate (mis)behaviour, to see how the CLI reacts. Returns True to end the loop."""
        log(f"=== action {act}")
        if act == "unknown_type":
            self.send_frames([struct.pack(">BBHII", VERSION, 9, 0, 0, 0)])
        elif act == "bad_version":
            self.send_frames([struct.pack(">BBHII", 3, T_PING, F_SYN, 0, 8) + bytes(8)])
        elif act == "bad_ack":
            self.send_frames([encode_frame(T_ACK, struct.pack(">Q", self.out_seq + 5))])
        elif act == "badping":
            self.send_frames([encode_frame(T_PING, b"1234", F_SYN)])
        elif act == "empty_record":
            self.send_frames([b""])
        elif act == "cut_record":   # a record whose last frame is cut short
            self.send_frames([encode_frame(T_PING, bytes(8), F_SYN)[:-3]])
        elif act == "gap":           # sequence number that skips one: must be dropped, ACK at once
            self.send_frames([encode_frame(T_MESSAGE, b"after a gap", 0, self.next_msg_id + 5, self.out_seq + 2)])
        elif act == "dup":           # repeat of the last sequenced frame: a copy, dropped
            self.send_frames([encode_frame(T_MESSAGE, b"duplicate", 0, self.next_msg_id - 1, self.out_seq)])
        elif act.startswith("say="):
            self.send_message(act[4:])
        elif act.startswith("big="):
            n = int(act[4:])
            self.send_message("B" * (n - 4) + "-END")
        elif act.startswith("datagram="):
            self.send(T_DATAGRAM, act[9:].encode())
        elif act.startswith("sendfile="):
            self.open_file_stream(act[9:])
        elif act.startswith("overrun="):
            # a new stream written past the receiver's first window without waiting for credit
            parity = 1 if self.fp < self.peer_fp else 2
            sid = self.last_opened + 2 if self.last_opened else parity
            self.last_opened = sid
            self.send_frames_quiet(T_DATA, RESOURCE_STREAM, F_SYN, sid)
            for _ in range(int(act[8:]) // MAX_FRAME):
                self.send_frames_quiet(T_DATA, bytes(MAX_FRAME), 0, sid)
        elif act.startswith("offers="):
            # N offers at once, each of a file of SIZE bytes whose data never comes (a hostile
            # sender holding the receiver's transfers open): offers=N:SIZE
            count, size = (int(x) for x in act[7:].split(":"))
            self.offer_without_data(count, size)
        elif act == "leave":
            self.send_control(C_LEAVE, self.session)
        elif act == "silent":
            self.silent = True
        elif act == "join":          # Sessions.md, The full mesh, step 2: JOIN with the session id
            self.sent_join = True
            self.send_control(C_JOIN, self.session)
        elif act == "noack":
            self.no_ack = True
        elif act == "ack":
            self.no_ack = False
        elif act == "phantom":
            self.phantom = True
        elif act == "drop":         # end this link abruptly; the pair goes on over the next one
            log("dropping the link without GO_AWAY (state kept for the next link)")
            self.no_ack = self.phantom = False
            self.dropped = True
            self.sock.close()
            return True
        elif act == "close":
            log("closing the socket without GO_AWAY")
            self.sock.close()
            return True
        elif act.startswith("goaway="):
            self.goaway(int(act[7:]), "test")
            return True
        elif act == "unknown_control":
            self.send_frames([encode_frame(T_CONTROL, bytes([42]))])
        elif act in ("stream_open", "wrong_parity", "int_parity"):
            # open a stream named test.txt, send data, FIN. WireFormat.md: "the peer whose
            # fingerprint sorts first uses odd stream ids" -- sorted as strings (ASCII), which
            # the CLI confirmed; int_parity sorts by the base32 value instead, to test that.
            first = self.fp < self.peer_fp
            if act == "int_parity":
                val = lambda f: int.from_bytes(base64.b32decode(f.upper()), "big")
                first = val(self.fp) < val(self.peer_fp)
            sid = 1 if first else 2
            if act == "wrong_parity":
                sid = 3 - sid
            self.send(T_DATA, b"test.txt", F_SYN, sid)
            self.send(T_DATA, b"hello stream", 0, sid)
            self.send(T_DATA, b"", F_FIN, sid)
        return False

    def goaway(self, code, reason):
        log(f"  -> GO_AWAY {code} {reason!r}")
        self.send_frames([encode_frame(T_GO_AWAY, struct.pack(">I", code) + reason.encode())])
        try:
            self.sock.shutdown(socket.SHUT_WR)
            # drain until the peer closes
            self.sock.settimeout(3)
            while True:
                (ln,) = struct.unpack(">H", read_exact(self.sock, 2))
                rec = read_exact(self.sock, ln)
                if self.encrypted: rec = self.noise.decrypt(rec)
                for f in decode_frames(bytes(rec)):
                    log(f"<- after GO_AWAY: {TYPE_NAMES[f['type']]} {f['payload'][:60]!r}")
        except Exception as e:
            log(f"link closed after GO_AWAY ({e.__class__.__name__}: {e})")

    def handle(self, f):
        t, p = f["type"], f["payload"]
        name = TYPE_NAMES[t] if t < len(TYPE_NAMES) else f"?{t}"
        seq = f" seq={f['seq']}" if f["seq"] is not None else ""
        desc = describe_control(p) if t == T_CONTROL else repr(p[:100])
        log(f"<- {name} ver={f['ver']} flags={f['flags']:#x} stream={f['stream']}{seq} len={len(p)} {desc}")
        if t in SEQUENCED and self.no_ack:
            log("   (not taken, not acknowledged: as if it never arrived)")
            return False
        if t in SEQUENCED:
            if f["seq"] != self.in_seq + 1:
                log(f"   (sequence {f['seq']} but expected {self.in_seq + 1}: dropped, ACK at once)")
                self.send_frames([self.ack_frame()])
                return False
            self.in_seq = f["seq"]
            if not self.ack_owed:
                self.ack_owed = True
                self.ack_due = time.monotonic() + 0.020     # "20 ms after the first frame not yet acknowledged"
        if t == T_ACK:
            (n,) = struct.unpack(">Q", p)
            self.kept = [(q, fr) for q, fr in self.kept if q > n]
        if t == T_PING and f["flags"] & F_SYN and not self.silent:
            self.send(T_PING, p, F_ACK)
        elif t == T_GO_AWAY:
            code = struct.unpack(">I", p[:4])[0]
            log(f"   peer said GO_AWAY code={code} reason={p[4:].decode(errors='replace')!r}")
            return True
        elif t == T_CONTROL:
            self.on_control(p)
        elif t == T_MESSAGE:
            self.partial[f["stream"]] = self.partial.get(f["stream"], b"") + p
            if not f["flags"] & F_MORE:
                msg = self.partial.pop(f["stream"])
                log(f"   MESSAGE #{f['stream']} complete: {msg!r}")
                if self.a.reply:
                    self.send_message("echo: " + msg.decode(errors="replace"))
                    self.done_at = time.monotonic() + self.a.linger
        elif t == T_DATAGRAM:
            log(f"   DATAGRAM: {p!r}")
        elif t == T_WINDOW_UPDATE and f["stream"] in self.resources:
            (credit,) = struct.unpack(">I", p)
            self.resources[f["stream"]].credit += credit
        elif t == T_DATA:
            self.on_stream_data(f)
        return False

    # -- files (Files.md) over streams (WireFormat.md, Streams) -------------
    def open_file_stream(self, path):
        """Opens a stream of our parity, named peerlink.resource, and offers the file on it."""
        parity = 1 if self.fp < self.peer_fp else 2
        sid = self.last_opened + 2 if self.last_opened else parity
        self.last_opened = sid
        rs = ResourceStream(sid, True, path)
        self.resources[sid] = rs
        sha = hashlib.sha256(rs.data).digest()
        size = len(rs.data)
        body = bytes([1]) + transfer_id(sha, size, rs.name) + struct.pack(">Q", size) + sha
        body += struct.pack(">H", len(rs.name)) + rs.name
        log(f"=== offering {rs.name.decode()} ({size} bytes) on stream {sid}")
        self.send(T_DATA, RESOURCE_STREAM, F_SYN, sid)
        self.stream_write(rs, resource_message(R_OFFER, body))

    def offer_without_data(self, count, size):
        parity = 1 if self.fp < self.peer_fp else 2
        for k in range(count):
            sid = self.last_opened + 2 if self.last_opened else parity
            self.last_opened = sid
            rs = ResourceStream(sid, False)   # we only read its answers
            rs.sending, rs.offset, rs.finished = True, None, True
            self.resources[sid] = rs
            name = f"held-{k}.bin".encode()
            sha = hashlib.sha256(str(k).encode()).digest()
            body = bytes([1]) + transfer_id(sha, size, name) + struct.pack(">Q", size) + sha
            body += struct.pack(">H", len(name)) + name
            self.send_frames_quiet(T_DATA, RESOURCE_STREAM, F_SYN, sid)
            self.stream_write(rs, resource_message(R_OFFER, body))
        log(f"=== {count} offers of {size} bytes sent, no data will follow")

    def stream_write(self, rs, data):
        """Writes resource bytes on a stream, in frames of at most 16 KiB, within its credit."""
        assert len(data) <= rs.credit, "the caller checks credit"
        for i in range(0, len(data), MAX_FRAME):
            self.send_frames_quiet(T_DATA, data[i:i + MAX_FRAME], 0, rs.sid)
        rs.credit -= len(data)

    def send_frames_quiet(self, ftype, payload, flags, stream):
        """send() without logging each frame (files are many frames)."""
        self.out_seq += 1
        frames = [encode_frame(ftype, payload, flags, stream, self.out_seq)]
        if self.ack_owed and not self.no_ack:
            frames.append(self.ack_frame())
        self.send_frames(frames)

    def pump_files(self):
        """Sends what credit allows of files whose offer was accepted."""
        for rs in list(self.resources.values()):
            if not rs.sending or rs.offset is None or rs.finished:
                continue
            while rs.offset < len(rs.data) and rs.credit >= 5 + 1:
                n = min(65536, len(rs.data) - rs.offset, rs.credit - 5)
                self.stream_write(rs, resource_message(R_DATA, rs.data[rs.offset:rs.offset + n]))
                rs.offset += n

    def on_stream_data(self, f):
        sid, flags, p = f["stream"], f["flags"], f["payload"]
        if flags & F_SYN:
            if p != RESOURCE_STREAM:
                log(f"   stream {sid} named {p!r}: not a resource stream, refused")
                self.send(T_DATA, b"only peerlink.resource here", F_RST, sid)
                return
            self.resources[sid] = ResourceStream(sid, False)
            self.send(T_WINDOW_UPDATE, struct.pack(">I", 0), F_ACK, sid)
            return
        rs = self.resources.get(sid)
        if rs is None:
            return
        if flags & F_RST:
            log(f"   stream {sid} reset by the peer: {p!r}")
            rs.finished = True
            return
        rs.inbox += p
        if not rs.sending:
            # WireFormat.md, Credit: grant back what was consumed once it is half the window.
            rs.consumed += len(p)
            if rs.consumed >= INITIAL_WINDOW // 2:
                self.send_frames_quiet(T_WINDOW_UPDATE, struct.pack(">I", rs.consumed), 0, sid)
                rs.consumed = 0
        for rtype, body in rs.messages():
            self.on_resource_message(rs, rtype, body)
        if flags & F_FIN:
            log(f"   stream {sid}: the peer finished its side")

    def on_resource_message(self, rs, rtype, body):
        if rtype != R_DATA:
            log(f"   resource {R_NAMES.get(rtype, rtype)} on stream {rs.sid}: {body[:80]!r}")
        if rs.sending:
            if rtype == R_ACCEPT:
                (rs.offset,) = struct.unpack(">Q", body)
            elif rtype == R_DECLINE:
                log(f"FILE declined: {body[2:].decode(errors='replace')}")
                rs.finished = True
            elif rtype == R_VERDICT:
                log(f"FILE sent, verdict {body[0]}{' (verified)' if body[0] == 0 else ''}")
                rs.finished = True
                self.send(T_DATA, b"", F_FIN, rs.sid)
            return
        if rtype == R_OFFER:
            version, tid, size, sha = body[0], body[1:17], struct.unpack(">Q", body[17:25])[0], body[25:57]
            (n,) = struct.unpack(">H", body[57:59])
            name = body[59:59 + n]
            ok = version == 1 and transfer_id(sha, size, name) == tid
            log(f"FILE offered: {name.decode(errors='replace')} {size} bytes, transfer id {'as derived' if ok else 'NOT as derived'}")
            rs.expected = (name, size, sha)
            self.stream_write(rs, resource_message(R_ACCEPT, struct.pack(">Q", 0)))
        elif rtype == R_DATA:
            rs.received += body
            name, size, sha = rs.expected
            if len(rs.received) == size:
                good = hashlib.sha256(rs.received).digest() == sha
                log(f"FILE received: {name.decode(errors='replace')} {size} bytes, SHA-256 {'verified' if good else 'MISMATCH'}")
                self.stream_write(rs, resource_message(R_VERDICT, bytes([0 if good else 1])))
                self.send(T_DATA, b"", F_FIN, rs.sid)
                rs.finished = True

    def on_control(self, p):
        ct, f = p[0], p[1:]
        if ct == C_INVITE:
            iid, sid = struct.unpack(">I16s", f[:20])
            if self.a.decline:
                self.send_control(C_DECLINE, struct.pack(">IB", iid, 0))
                return
            # Accepting takes the inviter's session id (Sessions.md, Session ids).
            self.session = sid
            self.send_control(C_ACCEPT, struct.pack(">I", iid))
            self.became_connected()
        elif ct == C_ACCEPT:
            self.became_connected()
            # the inviter sends MEMBERS (the roster) to the invitee: nobody else here.
            self.send_control(C_MEMBERS, self.session + bytes([0]))
        elif ct == C_MEMBERS:
            self.session = f[:16]
        elif ct == C_JOIN:
            if not self.sent_join:
                self.sent_join = True
                self.send_control(C_JOIN, f[:16])
            self.became_connected()
        elif ct == C_LEAVE:
            log("   peer LEFT the session")

    def schedule(self):
        """--act for the first link, --act2 for the next ones (relative to when they start)."""
        self.link_scheduled = True
        t0 = time.monotonic()
        specs = self.a.act if not getattr(self, "scheduled_once", False) else self.a.act2
        self.scheduled_once = True
        self.actions = sorted((t0 + float(d), act) for d, act in (x.split(":", 1) for x in specs))

    def became_connected(self):
        if self.connected:
            return
        self.connected = True
        if not self.link_scheduled:
            self.schedule()
        log(f"*** connected with {self.peer_name}")
        for text in self.a.say:
            self.send_message(text)
        if self.a.say and not self.a.reply:
            self.done_at = time.monotonic() + self.a.linger


def hostport(s):
    h, p = s.rsplit(":", 1)
    assert h == "127.0.0.1", "traffic only to 127.0.0.1"
    return h, p


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--listen", type=hostport)
    g.add_argument("--dial", type=hostport)
    ap.add_argument("--name", default="pyPeer")
    ap.add_argument("--service", default="peerlink")
    ap.add_argument("--encryption", default="required", choices=list(ENC))
    ap.add_argument("--versions", type=int, nargs="+", default=[2])
    ap.add_argument("--say", action="append", default=[])
    ap.add_argument("--reply", action="store_true")
    ap.add_argument("--invite", action="store_true")
    ap.add_argument("--decline", action="store_true")
    ap.add_argument("--linger", type=float, default=3.0)
    ap.add_argument("--max-time", type=float, default=40.0)
    ap.add_argument("--accept-timeout", type=float, default=30.0)
    ap.add_argument("--session-field", action="store_true")
    ap.add_argument("--session-id", default=None, help="hex; our session id (e.g. the CLI's automatic one)")
    ap.add_argument("--no-incarnation", action="store_true")
    ap.add_argument("--auto", action="store_true", help="use the automatic session id of --service")
    ap.add_argument("--early", action="store_true", help="run --act from the end of the handshake, not from joining")
    ap.add_argument("--links", type=int, default=1, help="accept/dial again after a 'drop' action")
    ap.add_argument("--restart-on-relink", action="store_true", help="new incarnation on the next link")
    ap.add_argument("--act2", action="append", default=[], help="SECONDS:ACTION on the links after the first")
    ap.add_argument("--act", action="append", default=[], help="SECONDS:ACTION after connecting (see do_action)")
    ap.add_argument("--bad", default=None,
                    help="magic|verdict|prologue|noname|longname|ctrlname|dupfield|inc0|unknownfield|cutfield|payload1")
    Peer(ap.parse_args()).run()
