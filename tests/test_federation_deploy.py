"""A real deployment on 127.0.0.1 (docs/federation.md), started as a user starts one, shared by
the tests of this module (in this order, on one xdist worker): site data files and node keys
(`incofl federation export --keys`), `incofl federation up` as it starts by default (TLS with
certificates it makes, node authentication), which runs the SuperLink (deploy/superlink.py) and a SuperNode for
client 0 with incofl's warm executor; client 1's node is started here, as a site elsewhere would
start it (flower-supernode with Flower's own SuperExec; its key registered with
`flwr supernode register`), so that it can be killed alone, and only once the first run's rogues
have answered (so that their replies are read before the run's clients have all joined). Then:

- a digits InCoAvg run with every client bound to its node's key (`node-keys`) equals the simulator,
  though no process can load the data set while it runs (the server reads export's facts file),
  every file up wrote private, though six registered nodes that speak Flower's protocol
  themselves (federation_rogue.py) answer its identify with replies no incofl node would send
  (four of them announce a reply and never upload it);
- up's node ran all its messages in its one executor process, the other node each in a fresh one;
- a node with a key nobody registered is refused by the SuperLink;
- only the federation's own SuperExecs (which hold `up`'s secret) can take a run's work;
- a site that reaches the port it dials (the Fleet API's) cannot use the Control API;
- a node speaking the Fleet API itself with its registered key cannot push past the gate's caps;
- site 1 answering client 0's message in client 0's name is refused by the ServerApp;
- client 1's flower-supernode SIGKILLed mid-round: with `allow-missing` the run ends without it;
- then a run whose ClientApp raises, and one whose reply up's node refuses (its ClientApp here:
  federation_executor_app.py), each fail their task only: up's warm executor serves the next;
- once stopped, no process any of this started is left (a /proc scan, recorded while it ran).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

import pandas as pd
import pytest

if not os.environ.get("CI"):
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")

import flwr.supernode.fleet_http_connection as fleet_connection  # noqa: E402
from federation_helpers import flower_env, free_port, write_config  # noqa: E402
from federation_rogue import per_thread_certificates  # noqa: E402

from incofl.cli import run as incofl  # noqa: E402
from incofl.config import load_run_config  # noqa: E402
from incofl.deploy import REPLY_OVERHEAD  # noqa: E402
from incofl.fl.engine.simulator import train  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployment"), pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEPLOYED = {"clients": 2, "ratio": 1.0, "rounds": 2}  # two nodes, both training every round
ELSEWHERE = 1  # the client whose node this module starts (and kills)
CONNECTION = "deployment"


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(ppid, process group, session, start time) of a live process; None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _processes() -> dict[int, tuple[int, int, int, int]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            found[int(entry.name)] = stat
    return found


class Started:
    """Every process started from the roots (this module's Popens), recorded every 0.2 s while
    the deployment runs: a Flower process that detaches (a new session) or is orphaned when its
    parent is killed is still known by its pid and start time, and any later process of a
    recorded session too."""

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.seen: dict[int, int] = {}  # pid -> start time
        self.commands: dict[int, str] = {}  # pid -> its command line when first seen
        self.sessions: set[int] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(0.2):
            self.record()

    def record(self) -> None:
        """Add every live descendant of the roots and of the recorded processes, and the members of their sessions."""
        procs = _processes()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        todo = [pid for pid in self.roots if pid in procs]
        todo += [pid for pid, start in self.seen.items() if pid in procs and procs[pid][3] == start]
        todo += [pid for pid, stat in procs.items() if stat[2] in self.sessions]
        visited: set[int] = set()
        while todo:
            pid = todo.pop()
            if pid in visited or pid not in procs:
                continue
            visited.add(pid)
            self.seen.setdefault(pid, procs[pid][3])
            if (command := _command(pid)) != "(gone)":  # the latest: between fork and exec, the parent's
                self.commands[pid] = command
            self.sessions.add(procs[pid][2])
            todo += children.get(pid, [])

    def alive(self) -> list[str]:
        """The recorded processes still running (same pid and start time), with their command lines."""
        self.record()
        procs = _processes()
        left = [pid for pid, start in self.seen.items() if pid in procs and procs[pid][3] == start]
        return [f"{pid}: {_command(pid)}" for pid in left]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


@dataclass
class Deployment:
    root: Path
    config: Path
    env: dict[str, str]
    started: Started
    up: subprocess.Popen | None = None
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: list = field(default_factory=list)
    port: int = 0
    rogues: list = field(default_factory=list)  # the nodes of federation_rogue.py in the first run
    run: int = 0  # the first run's id
    elsewhere_id: int = 0  # the node id the SuperLink gave client 1's key
    simulated: dict = field(default_factory=dict)  # the simulator's summary of the first run

    def start(self, argv: list[str | Path], log: str, **kwargs: object) -> subprocess.Popen:
        out = open(self.root / f"{log}.log", "w")  # noqa: SIM115 (closed in stop)
        self.logs.append(out)
        proc = subprocess.Popen(list(map(str, argv)), stdout=out, stderr=subprocess.STDOUT, env=self.env, **kwargs)
        self.started.roots.append(proc.pid)
        self.started.record()
        return proc

    def supernode(self, name: str, key: Path, client: int, data: Path, port: int) -> subprocess.Popen:
        """Flower's SuperNode (its own SuperExec, a fresh flwr-clientapp a message) with the site's
        certificate (supernode.py): a site elsewhere, started as the docs say."""
        certificates = self.root / "sites" / "certificates"
        argv = [sys.executable, "-m", "incofl.deploy.supernode", "--root-certificates", certificates / "ca.pem"]
        argv += ["--client-certificate", certificates / "node1.pem", "--client-key", certificates / "node1.key"]
        argv += ["--auth-supernode-private-key", key]
        argv += ["--superlink", f"127.0.0.1:{self.port}", "--port", port]
        argv += ["--node-config", f'client={client} data-path="{data}" node-key="{key}"']  # it signs its replies
        self.nodes[name] = self.start(argv, name, start_new_session=True)
        return self.nodes[name]

    def start_elsewhere(self) -> subprocess.Popen:
        """Client ELSEWHERE's node, with its key and its site file (moved out of `sites`)."""
        key, data = self.root / "sites" / "keys" / f"node{ELSEWHERE}", self.root / "elsewhere" / f"site{ELSEWHERE}.npz"
        return self.supernode("elsewhere", key, ELSEWHERE, data, self.port + 3)

    def flwr_run(self, out: Path, **settings: str | int) -> int:
        """The run's id, once `flwr run` has started it."""
        keys = self.root / "sites" / "keys"
        given = {"config": f'"{self.config}"', "out": f'"{out}"', "node-keys": f'"{keys}"', "join-timeout": 60}
        run_config = " ".join(f"{k}={v}" for k, v in {**given, **settings}.items())  # a key once: flwr reads TOML
        argv = [BIN / "flwr", "run", REPO / "flower-app", CONNECTION, "--run-config", run_config]
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return int(re.search(r"Successfully started run (\d+)", done.stdout)[1])

    def run_log(self, run: int) -> str:
        """What the run's ServerApp logged (Flower keeps it on the SuperLink: `flwr log`)."""
        argv = [BIN / "flwr", "log", str(run), CONNECTION, "--show"]
        return subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=self.env, timeout=60).stdout

    def stop(self) -> None:
        for proc in [self.up, *self.nodes.values()]:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # up stops its SuperLink and SuperNodes
        for proc in filter(None, [self.up, *self.nodes.values()]):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self.logs:
            log.close()

    def wait_for(self, path: Path, timeout: float, text: str = "", count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists() or path.read_text().count(text) < count:
            if time.monotonic() > deadline or (self.up is not None and self.up.poll() is not None):
                tails = {p.name: p.read_text()[-1500:] for p in self.root.rglob("*.log")}
                pytest.fail(f"{path.name} not written within {timeout:.0f} s; logs: {json.dumps(tails, indent=1)}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Site 0 under `incofl federation up`, site 1's node started here (module docstring)."""
    root = tmp_path_factory.mktemp("deployment")
    test_app = f"{REPO / 'tests' / 'federation_executor_app.py'}:app"  # incofl's, but one push
    env = flower_env(root, REPO, INCOFL_EXECUTOR_TEST_APP=test_app)
    config = write_config(root, **DEPLOYED)
    sites, elsewhere = root / "sites", root / "elsewhere"
    assert incofl(["federation", "export", "--config", str(config), "--out", str(sites), "--keys"]) == 0
    (root / "cache").rename(root / "cache.held")  # from now on no process can load the data set (its folder: a file)
    (root / "cache").write_text("the server's machine holds no data set: the facts file and the test split only")
    elsewhere.mkdir()
    (sites / f"site{ELSEWHERE}.npz").rename(elsewhere / f"site{ELSEWHERE}.npz")
    dep = Deployment(root, config, env, Started())
    fleet_client = fleet_connection.FleetHttpClient  # this process's Fleet clients (the rogues', the tests') show
    per_thread_certificates((sites / "certificates" / "node1.pem", sites / "certificates" / "node1.key"))  # a site's
    dep.port = free_port(5)  # the SuperLink's Fleet and Control ports, up's node, the node elsewhere, the stranger
    argv = [sys.executable, "-m", "incofl.cli", "federation", "up", "--sites", sites, "--port", dep.port]
    dep.up = dep.start([*argv, "--connection", CONNECTION], "up", start_new_session=True)
    try:
        dep.wait_for(root / "up.log", timeout=120, text="federation up:")
        register = [BIN / "flwr", "supernode", "register", sites / "keys" / f"node{ELSEWHERE}.pub", CONNECTION]
        done = subprocess.run(register, env=env, check=True, capture_output=True, text=True, timeout=60)
        dep.elsewhere_id = int(re.search(r"SuperNode (\d+) registered", done.stdout).group(1))  # type: ignore[union-attr]
        yield dep
    finally:
        fleet_connection.FleetHttpClient = fleet_client
        dep.stop()
        dep.started.done.set()


def test_a_deployment_secure_by_default_equals_the_simulator(deployment, tmp_path):
    up_log = (deployment.root / "up.log").read_text()
    assert "TLS, node authentication" in up_log and "can flwr run an app that runs as this user" in up_log
    assert f'node-keys="{deployment.root / "sites" / "keys"}"' in up_log  # the flwr run line to copy
    toml = (deployment.root / "flwr-home" / "config.toml").read_text()
    assert f"[superlink.{CONNECTION}]" in toml and "root-certificates" in toml and "insecure" not in toml
    sites = deployment.root / "sites"
    private = [*sites.glob("site?.npz"), *sites.glob("keys/*"), *sites.glob("certificates/*"), *sites.glob("logs/*")]
    private += [*sites.glob("superlink/*"), sites / "keys" / "superexec.secret"]
    assert len(private) >= 12 and {p.stat().st_mode & 0o777 for p in private} == {0o600}
    assert {p.stat().st_mode & 0o777 for p in (sites / "keys", sites / "logs")} == {0o700}
    assert not (sites / "superlink").exists()  # its state in memory, up's default (--link-state)
    out = deployment.root / "deployed"
    deployment.rogues = _rogues(deployment)  # test_replies_a_node_crafts_... reads what they did
    refused = []  # Flower's node sends itself SIGINT when a heartbeat gets 401: here, this worker
    interrupt = signal.signal(signal.SIGINT, lambda *_: refused.append("a rogue's heartbeat got 401"))
    threads = [rogue.start() for rogue in deployment.rogues]
    try:
        # each connected before the run asks every node to identify
        _until(lambda: all(rogue.node or rogue.error for rogue in deployment.rogues), 60)
        deployment.run = deployment.flwr_run(out, **{"round-timeout": 120})
        # client 1's node joins once every rogue has answered: their replies are read before the run's
        # clients have all joined (identify stops there), however slowly a loaded machine pushes them
        _until(lambda: all(rogue.answered.is_set() or rogue.error for rogue in deployment.rogues), 120)
        deployment.start_elsewhere()
        deployment.wait_for(out / "summary.json", timeout=400)
    finally:
        for rogue in deployment.rogues:
            rogue.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        signal.signal(signal.SIGINT, interrupt)
    assert not refused, "a rogue's certificate was not yet bound to its key (up's SIGHUP line came too early)"
    deployed = json.loads((out / "summary.json").read_text())
    (deployment.root / "cache").unlink()  # the data set back, for the simulator alone
    (deployment.root / "cache.held").rename(deployment.root / "cache")
    deployment.simulated = simulated = train(load_run_config(deployment.config), tmp_path / "simulator")
    assert deployed["state_sha256"] == simulated["state_sha256"]
    assert deployed["final_acc"] == simulated["final_acc"]


def _until(done: Callable[[], bool], seconds: float) -> None:
    """Once `done()` holds, or `seconds` have passed (what was not done, the test then finds)."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


STALLED = 4  # nodes that announce a reply and never upload it: as many as the ServerApp pulled at once before
ROGUE = 100  # the first rogue's site certificate is client ROGUE's (a client the run does not have)


def _rogues(deployment: Deployment) -> list:
    """Nodes of federation_rogue.py, each with a key of its own that the operator registered and a
    site certificate bound to it (as client ROGUE + i's: its key in `sites/keys`, up told by SIGHUP):
    one whose reply does not decode and STALLED that stall dial the sites' port (nginx, the gate),
    the last the SuperLink's loopback listener (Flower's app whole)."""
    from federation_rogue import Rogue

    from incofl.deploy.wire.credentials import node_certificate, node_key

    sites = deployment.root / "sites"
    ca = (sites / "certificates" / "ca.pem").read_bytes()
    rogues = []
    gate, whole = deployment.port, deployment.port + 1
    kinds = [("undecodable", gate), ("oversized", gate), *[("stalled", gate)] * STALLED, ("unasked", whole)]
    for i, (kind, port) in enumerate(kinds):
        private, public = node_key(sites / "keys", ROGUE + i)
        register = [BIN / "flwr", "supernode", "register", public, CONNECTION]
        subprocess.run(list(map(str, register)), env=deployment.env, check=True, capture_output=True, timeout=60)
        certificate = node_certificate(sites / "certificates", ROGUE + i)
        rogues.append(Rogue(f"127.0.0.1:{port}", ca, private, kind, certificate=certificate))
    deployment.up.send_signal(signal.SIGHUP)
    deployment.wait_for(deployment.root / "up.log", timeout=60, text="certificate bound again")
    return rogues


def test_a_peer_without_a_sites_certificate_cannot_finish_a_handshake(deployment):
    """The sites' port asks every peer for a certificate its CA issued: without one (a stock
    flower-supernode's client) a request gets no answer; with a site's, the same request does."""
    import ssl

    certificates = deployment.root / "sites" / "certificates"
    for certificate in (False, True):
        context = ssl.create_default_context(cafile=str(certificates / "ca.pem"))
        if certificate:
            context.load_cert_chain(certificates / "node0.pem", certificates / "node0.key")
        try:
            with socket.create_connection(("127.0.0.1", deployment.port), timeout=10) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:  # TLS 1.3: refused at first read
                    conn.sendall(b"POST /v1/fleet/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                    answer = conn.recv(100)
        except (ssl.SSLError, ConnectionResetError):
            answer = b""
        assert answer.startswith(b"HTTP/1.1 404") == certificate, answer


def test_ups_node_runs_every_message_in_its_one_warm_executor(deployment):
    """After the run above: up's node (client 0) ran identify, train and evaluate in one long-lived
    executor process (no flwr-clientapp of its own); the node started apart, one flwr-clientapp each."""
    commands = list(deployment.started.commands.values())
    own = f"127.0.0.1:{deployment.port + 2}"  # up's node's Runtime API
    executors = [c.split() for c in commands if "incofl.deploy.executor" in c]
    assert len(executors) == 1 and own in executors[0]
    clientapps = [c.split() for c in commands if "flwr-clientapp" in c]
    assert not any(own in c for c in clientapps)
    spawned = (deployment.root / "elsewhere.log").read_text().count("Start `flwr-clientapp` process")
    assert spawned >= 3  # elsewhere: identify, 2 trains (Flower's log: the 0.2 s recorder may miss one under load)


def test_a_node_whose_key_is_not_registered_is_refused(deployment):
    """A node showing client 1's site certificate with a key nobody registered: nginx answers its
    activation 401 (its key is not the one bound to that certificate), as Flower answers a key it
    does not know, and the node stops, never having received a message."""
    from incofl.deploy.wire.credentials import node_key

    stranger = node_key(deployment.root / "stranger", 0)[0]  # claims client 0, with a key nobody registered
    sites = deployment.root / "sites"
    proc = deployment.supernode("stranger", stranger, 0, sites / "site0.npz", deployment.port + 4)
    proc.wait(timeout=120)  # Flower's node stops itself on a 401 (SIGINT to itself: exit 0)
    log = (deployment.root / "stranger.log").read_text()
    assert "SuperNode terminated gracefully" in log and "Receiving:" not in log


def test_only_the_federations_superexecs_can_take_its_runs_work(deployment):
    """Flower's Runtime API hands a ServerApp's or a message's task to whoever asks; `up` starts the
    SuperLink and its nodes with a secret that only its own SuperExecs hold."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.runtime.runtime_http_client import RuntimeHttpClient
    from httpx import HTTPStatusError

    ca = deployment.root / "sites" / "certificates" / "ca.pem"
    for port, certificates in [
        (deployment.port + 1, ca.read_bytes()),
        (deployment.port + 2, None),
    ]:  # SuperLink, node 0
        client = RuntimeHttpClient.from_server_address(
            server_address=f"127.0.0.1:{port}",
            insecure=certificates is None,
            root_certificates=certificates,
            interceptors=[],
        )
        with pytest.raises(HTTPStatusError, match="401 Unauthorized"):
            client.AcquireTask(AcquireTaskRequest(supported_task_types=["flwr-serverapp", "flwr-clientapp"]))
        client.close()


def test_a_site_that_reaches_the_fleet_port_cannot_use_the_control_api(deployment):
    """What sites dial (up's --port) serves Flower's Fleet API only: flwr's own CLI pointed at it can
    neither list runs nor register a key; the operator's connection (the next port, 127.0.0.1) can."""
    ca = deployment.root / "sites" / "certificates" / "ca.pem"
    toml = deployment.root / "flwr-home" / "config.toml"
    with open(toml, "a") as fh:
        fh.write(f'\n[superlink.site]\naddress = "127.0.0.1:{deployment.port}"\nroot-certificates = "{ca}"\n')
    from incofl.deploy.wire.credentials import node_key

    key = node_key(deployment.root / "site-key", 0)[1]  # a key of the site's own making
    for connection, refused in [("site", True), (CONNECTION, False)]:
        for command in (["ls"], ["supernode", "register", key]):
            argv = list(map(str, [BIN / "flwr", *command, connection]))
            done = subprocess.run(argv, capture_output=True, text=True, env=deployment.env, timeout=60)
            assert (done.returncode != 0) == refused, (argv, done.stdout + done.stderr)


def test_a_node_cannot_make_the_server_hold_more_than_the_gate_allows(deployment):
    """A registered node (client 1's key) speaking Flower's Fleet API itself, with Flower's own client:
    a 64 MiB object is refused before it is read (nginx: past push-object's cap), an instruction (a message
    that answers none) and an object no accepted reply asked for are refused; what it may push is the
    objects of a reply to the server's message, up to the message cap (superlink.py)."""
    import httpx
    from cryptography.hazmat.primitives import serialization
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common.serde import message_to_proto
    from flwr.proto.fleet_pb2 import PushMessagesRequest
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.inflatable.inflatable_object import get_object_tree
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor

    sites = deployment.root / "sites"
    key = serialization.load_ssh_private_key((sites / "keys" / f"node{ELSEWHERE}").read_bytes(), password=None)
    fleet = fleet_connection.FleetHttpClient.from_server_address(
        f"127.0.0.1:{deployment.port}",
        insecure=False,
        root_certificates=(sites / "certificates" / "ca.pem").read_bytes(),
        interceptors=[NodeAuthHttpInterceptor(key, key.public_key())],  # type: ignore[arg-type]
    )
    node = Node(node_id=deployment.elsewhere_id)  # its own: Flower would take what the gate lets through
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a Message is made with
    instruction = Message(RecordDict({"c": ConfigRecord({"lr": 1.0})}), dst_node_id=2, message_type="train")
    instruction.metadata.__dict__["_message_id"] = instruction.object_id
    tree = get_object_tree(instruction)
    pushes = [
        (fleet.PushObject, PushObjectRequest(node=node, run_id=1, object_id="0" * 64, object_content=bytes(64 << 20))),
        (fleet.PushMessages, PushMessagesRequest(node=node, messages_list=[message_to_proto(instruction)])),
        (fleet.PushObject, PushObjectRequest(node=node, run_id=1, object_id="1" * 64, object_content=b"x")),
        (fleet.PushObject, PushObjectRequest(node=node, run_id=1, object_id=sha256(b"x").hexdigest())),
    ]
    pushes[3][1].object_content = b"x"  # what its id says: an object, but of no reply of this node
    pushes[1][1].message_object_trees.append(tree)
    refused = []
    for call, request in pushes:
        with pytest.raises(httpx.HTTPStatusError) as err:
            call(request)
        response = err.value.response
        refused.append((response.status_code, response.json()["detail"] if response.status_code != 413 else ""))
    fleet._client.close()
    assert refused == [
        (413, ""),  # nginx's, before a byte of the body is read: past push-object's cap (gate.ROUTES)
        (403, "a node pushes replies only"),
        (403, "an object whose content is not what its id hashes"),
        (403, "an object of no reply pushed here"),
    ]


def test_replies_a_node_crafts_with_flowers_own_client_neither_stop_nor_stall_the_server(deployment):
    """Seven registered nodes that speak Flower's protocol themselves (federation_rogue.py), present
    in the first test's run (two rounds) and asked its identify: one answers with bytes Flower
    cannot decode (hash, header and length right: the SuperLink stores them), one with a reply of
    2 MiB, within the gate's caps but past what an identify reply may be (the ServerApp stops
    pulling it at its cap, `incofl.deploy.REPLY_OVERHEAD`, and refuses it: before, it pulled a reply whole
    before the codec checked its size), four announce a reply
    and never upload it, and one sends the SuperLink a message of its own, never uploaded, through
    the loopback listener (Flower's app whole, as a SuperLink without the gate serves its sites: the
    gate refuses it). Before, the first raised out of the ServerApp's pull, and a stalled reply held
    it until its upload session expired (Flower retries a reply's objects until then: 180 s after
    the last object pushed, the run's join had run out); then the four stalled replies held the
    ServerApp's four pulling workers until the join's deadline, and the honest nodes' replies,
    queued behind them, came too late: their clients never joined. Now each is its node's fault
    or ignored, each reply is pulled in a thread of its own, and the run ends with the simulator's
    weights. (The run is the first test's, so that one run serves both: a run of its own cost this
    module about 50 s.)"""
    assert len(deployment.rogues) == STALLED + 3 and deployment.simulated, "the first test's run did not complete"
    unanswered = [(rogue.kind, rogue.node, rogue.error) for rogue in deployment.rogues if not rogue.answered.is_set()]
    assert not unanswered, f"rogues never asked identify (kind, node id: 0 if never activated, errors): {unanswered}"
    deployed = json.loads((deployment.root / "deployed" / "summary.json").read_text())
    assert deployed["state_sha256"] == deployment.simulated["state_sha256"]
    assert f"refused: its reply passed the {REPLY_OVERHEAD} bytes its plan allows" in deployment.run_log(deployment.run)


def test_a_supernode_killed_mid_round_is_left_out_with_allow_missing(deployment):
    node = deployment.nodes["elsewhere"]
    log = deployment.root / "elsewhere.log"
    trained = log.read_text().count("Receiving: train message")
    out = deployment.root / "killed"
    # the round waits out the killed node: up's warm node answered a train message in 7-14 s under a
    # load of 4.7 on 2 cores (the slower beside a fresh flwr-clientapp's imports), so 20 s, not 30
    deployment.flwr_run(out, set='"rounds=1"', **{"allow-missing": "true", "round-timeout": 20})
    deployment.wait_for(log, timeout=120, text="Receiving: train message", count=trained + 1)
    node.send_signal(signal.SIGKILL)  # the node itself, as a crash would: its own helpers are left to notice
    node.wait(timeout=30)  # reaped, as its parent would: Flower's helpers watch for their parent's pid to go
    deployment.wait_for(out / "summary.json", timeout=300)
    rounds = pd.read_csv(out / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == [str(ELSEWHERE)]
    assert rounds["samples"].iloc[0] > 0  # client 0 was averaged


def test_an_app_that_raises_or_a_push_the_node_refuses_fails_its_task_and_the_warm_executor_serves_on(deployment):
    """Once client 1's node is gone (each run ends at identify, join-timeout), three runs in turn
    on up's node, all served by its one warm executor:

    - a run whose config partitions otherwise than the site files (its facts file, which the
      server checks the config against, exported so too): the ClientApp raises at identify, and
      the executor reports it (before, any exception but one of the app's ended it, and up with
      it) and serves the next message, the next run's identify;
    - that run's identify reply claims another run (federation_executor_app.py), which Flower's
      SuperNode refuses (403, raised by Flower's HTTP retry as RunNotRunningException, a
      BaseException): the executor logs it as that task's failure and pushes an error reply in its
      place, which the node sends on (before, the exception ended the executor, and up with it);
    - the third run's identify is served and answered by the same executor, and up runs on.

    (One test, so that the run after the raise is the push that fails: a run fewer, 10 s.)"""
    from federation_executor_app import FAILING

    from incofl.deploy.server.serverdata import FACTS, export_facts, load_facts
    from incofl.deploy.wire.signing import private_key

    log = deployment.root / "sites" / "logs" / "executor0.log"
    node = deployment.root / "sites" / "logs" / "supernode0.log"
    text = log.read_text()
    raised, failed = text.count("ClientApp raised an exception"), text.count("Failed to push the reply")
    keys, other = deployment.root / "sites" / "keys", deployment.root / "facts-seed99.npz"
    key = private_key(keys / "server")
    held, facts = load_facts(keys / FACTS, load_run_config(deployment.config), key.public_key())
    export_facts(load_run_config(deployment.config, {"partition_seed": 99}), held, facts, other, key)
    settings = {"join-timeout": 5, "facts": f'"{other}"'}
    deployment.flwr_run(deployment.root / "raises", set='"partition_seed=99"', **settings)
    deployment.wait_for(log, timeout=120, text="ClientApp raised an exception", count=raised + 1)
    assert "partition_seed" in log.read_text()
    start = len(node.read_text())
    deployment.flwr_run(deployment.root / FAILING, **{"join-timeout": 5})
    deployment.wait_for(log, timeout=120, text="Failed to push the reply", count=failed + 1)
    deployment.flwr_run(deployment.root / "after-push-fails", **{"join-timeout": 5})
    # on the node, in order: the identify of the run after the raise, Flower's refusal of its reply
    # ("Run ID in message does not match authenticated task's run ID"), the error reply sent in its
    # place, the next run's identify received and answered
    steps = ("Receiving: query.identify", "ApiError:3014", "Sent successfully", "Receiving: query.identify")
    steps += ("Sent successfully",)
    deadline = time.monotonic() + 120
    while not _in_order(node.read_text()[start:], steps):
        assert time.monotonic() < deadline and deployment.up.poll() is None, node.read_text()[start:]
        time.sleep(0.2)
    text = log.read_text()
    assert "RunNotRunningException" in text and text.count("Failed to push the reply") == failed + 1
    assert text.count("ClientApp raised an exception") == raised + 1  # the push that failed raised nothing
    executor = [pid for pid, cmd in deployment.started.commands.items() if "incofl.deploy.executor" in cmd]
    assert len(executor) == 1 and _stat(executor[0]) is not None and deployment.up.poll() is None


def _in_order(text: str, marks: tuple[str, ...]) -> bool:
    at = 0
    for mark in marks:
        if (at := text.find(mark, at)) < 0:
            return False
        at += len(mark)
    return True


def test_a_site_that_answers_another_sites_message_in_its_name_is_refused(deployment):
    """Site 1 (its site key; a node connection of its own, with a key the operator registered)
    answers client 0's round-1 message in client 0's name through the SuperLink's loopback
    listener (Flower's app whole, as a SuperLink without the gate serves its sites), with Flower's
    own client (federation_rogue.Forger), before client 0's node does (up's node waits for it:
    federation_executor_app.py). Flower stores it as client 0's reply (it checks only that the
    message it answers went to the node its header names) and drops client 0's own; the ServerApp
    refuses it, its signature not client 0's site's, and with allow-missing the round goes on
    with client 1's update alone. (Last of the runs on up's node: once its held reply is refused,
    the node was seen slow to take its next message, once past a next run's 60 s join-timeout; so
    client 1's node, killed above, is started again for it, with a new key: its site's certificate
    is bound to it again by SIGHUP to up.)"""
    from federation_executor_app import FORGED
    from federation_rogue import Forger

    from incofl.deploy.wire.credentials import node_key

    sites = deployment.root / "sites"
    # client 1's site again, with a key of its own (the killed node's may still count as in use) and
    # a port of its own: its key registered, and bound to its site's certificate at the sites' port
    # (up reloads nginx on SIGHUP); the old key kept apart, for the forger to sign with
    keys, old = sites / "keys", deployment.root / "keys-old"
    old.mkdir()
    for name in (f"node{ELSEWHERE}", f"node{ELSEWHERE}.pub"):
        (keys / name).rename(old / name)
    again, again_public = node_key(keys, ELSEWHERE)
    register = [BIN / "flwr", "supernode", "register", again_public, CONNECTION]
    subprocess.run(list(map(str, register)), env=deployment.env, check=True, capture_output=True, timeout=60)
    deployment.up.send_signal(signal.SIGHUP)
    deployment.wait_for(deployment.root / "up.log", timeout=60, text="certificate bound again")
    data = deployment.root / "elsewhere" / f"site{ELSEWHERE}.npz"
    deployment.supernode("again", again, ELSEWHERE, data, free_port(1))
    private, public = node_key(deployment.root / "forger", 0)
    register = [BIN / "flwr", "supernode", "register", public, CONNECTION]
    subprocess.run(list(map(str, register)), env=deployment.env, check=True, capture_output=True, timeout=60)
    ca = (sites / "certificates" / "ca.pem").read_bytes()
    out = deployment.root / FORGED
    forger = Forger(
        f"127.0.0.1:{deployment.port + 1}",
        ca,
        private,
        old / f"node{ELSEWHERE}",
        0,
        out.with_name(f"{FORGED}.asked"),
        out.with_name(f"{FORGED}.forged"),
    )
    thread = forger.start()
    try:
        settings = {"allow-missing": "true", "round-timeout": 120}
        run = deployment.flwr_run(out, set='"rounds=1"', **settings)
        deployment.wait_for(out / "summary.json", timeout=300)
    finally:
        forger.stop.set()
        thread.join(timeout=30)
    assert not forger.error and forger.forged.exists(), forger.error
    assert "client 0: refused: its signature is not client 0's site's" in deployment.run_log(run)
    rounds = pd.read_csv(out / "rounds.csv", dtype={"missing": str})
    assert rounds["missing"].tolist() == ["0"] and rounds["samples"].iloc[0] > 0  # client 1 averaged


def test_once_stopped_no_process_it_started_is_left(deployment):
    deployment.stop()
    deadline = time.monotonic() + 60  # Flower's helpers exit on their own, seconds after their parent
    while (left := deployment.started.alive()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(deployment.started.seen) >= 8  # up, its SuperLink, nodes, SuperExecs, ServerApps, ClientApps
    assert not left, left
