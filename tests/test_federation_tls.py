"""A federation as a deployment runs it: TLS and SuperNode authentication as Flower 1.42 does them.

One federation start (``local_federation(..., tls=True, supernode_auth=True)``): a CA and a server
certificate for 127.0.0.1/localhost are made on the fly, each site's ECDSA P-384 key is registered
with ``flwr supernode register`` before its SuperNode starts. On it:
- FedAvg, 1 round, writes ``final.json``/``history.csv`` (and the model, the predictions) byte for byte
  equal to the engine's: TLS and authentication change the transport, not a number;
- a SuperNode whose key was never registered is refused by the SuperLink (Flower: HTTP 412, API error
  2004 "Failed to activate SuperNode", the node exits with code 305) and never becomes a node;
- a SuperNode and a ``flwr`` CLI that do not hold the CA certificate fail the TLS handshake, and so
  does a plain TLS client (Python's ``ssl``), which succeeds with the CA.
The certificate files themselves are checked in ``test_tls_files_*`` (fast, no Flower process).
Skipped where the ``flower`` extra is not installed."""

import datetime
import filecmp
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

flwr = pytest.importorskip("flwr")

from cryptography import x509  # noqa: E402  (a dependency of flwr)
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from fedmedbench.errors import ConfigError  # noqa: E402
from fedmedbench.federation.credentials import make_node_key, make_tls_files  # noqa: E402
from fedmedbench.federation.local import CONNECTION, local_federation  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402


def test_tls_files_chain_to_the_ca_and_name_the_hosts(tmp_path):
    files = make_tls_files(tmp_path / "certs", hosts=("127.0.0.1", "localhost", "link.example.org"))
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "link.example.org"]
    lifetime = server.not_valid_after_utc - server.not_valid_before_utc
    assert lifetime == datetime.timedelta(days=1)
    # The server key is the certificate's; private keys are readable by their owner only.
    key = serialization.load_pem_private_key(files.server_key.read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    assert files.server_key.stat().st_mode & 0o777 == 0o600 and files.ca_key.stat().st_mode & 0o777 == 0o600
    # Python's TLS stack accepts the pair as a server identity and the CA as the trust root.
    context = ssl.create_default_context(cafile=str(files.ca_cert))
    context.load_cert_chain(files.server_cert, files.server_key)
    with pytest.raises(ValueError, match="at least one host"):
        make_tls_files(tmp_path / "none", hosts=())


def test_node_keys_are_what_flower_reads(tmp_path):
    from flwr.cli.supernode.register import try_load_public_key

    key = make_node_key(tmp_path / "keys", "BIDMC")
    private = serialization.load_ssh_private_key(key.private.read_bytes(), None)
    public = serialization.load_ssh_public_key(key.public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()
    assert key.public.read_text().startswith("ecdsa-sha2-nistp384 ") and key.public.read_text().rstrip().endswith(
        "fedmedbench-BIDMC"
    )
    assert key.private.stat().st_mode & 0o777 == 0o600
    # What `flwr supernode register` sends to the SuperLink: the same key, as PEM.
    sent = serialization.load_pem_public_key(try_load_public_key(key.public))
    assert sent.public_numbers() == public.public_numbers()
    assert make_node_key(tmp_path / "keys", "other").public.read_bytes() != key.public.read_bytes()


def test_supernode_auth_without_tls_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="supernode_auth=True needs tls=True"):
        with local_federation({"A": {}}, tmp_path / "fed", supernode_auth=True):
            pass
    assert not (tmp_path / "fed" / "superlink.log").exists()


def _handshake(port: int, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.version()


@pytest.mark.slow
@pytest.mark.federation
def test_tls_and_supernode_auth_equal_the_engine_and_refuse_strangers(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=1)
    # One CPU thread on both sides (the sites' default): another count changes summation order.
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    sites = {name: {"store": str(store), "split": str(split)} for name in cfg["clients"]}

    # warm: the app processes forked from one interpreter that has imported torch (federation.warm;
    # Flower's entry points and arguments unchanged, TLS included): a fresh process per message
    # would make this test cost ~3x the CPU (measured: 260 s vs 72 s of CPU, all processes).
    with local_federation(sites, tmp_path / "fed", tls=True, supernode_auth=True, warm=True) as fed:
        connection = (fed.workdir / "flwr-home" / "config.toml").read_text()
        assert f'root-certificates = "{fed.tls.ca_cert}"' in connection and "insecure" not in connection
        # A plain TLS client: the handshake needs the CA; the certificate names 127.0.0.1.
        assert _handshake(fed.port, ssl.create_default_context(cafile=str(fed.tls.ca_cert))).startswith("TLS")
        with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
            _handshake(fed.port, ssl.create_default_context())

        # Strangers, started beside the run (each spends seconds importing Flower):
        # a SuperNode with a key nobody registered ...
        stranger_key = make_node_key(tmp_path / "stranger", "stranger")
        stranger = fed.start_supernode("stranger", sites["A"], private_key=stranger_key.private, wait=False)
        # ... a SuperNode with site B's registered key but without the CA certificate ...
        no_ca = fed.start_supernode(
            "no-ca", sites["B"], private_key=fed.node_keys["B"].private, root_certificates=None, wait=False
        )
        # ... and a flwr CLI whose connection names the SuperLink but not the CA.
        home = tmp_path / "no-ca-home"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "plain"\n\n[superlink.plain]\naddress = "{fed.address}"\n'
        )
        cli = subprocess.Popen([str(Path(sys.executable).with_name("flwr")), "ls", "plain"], env={**fed.env, "FLWR_HOME": str(home)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

        result = fed.run({"run-config": str(tmp_path / "run.json"), "out": str(tmp_path / "flower")}, timeout=600)
        assert (tmp_path / "flower" / "final.json").is_file(), result.stdout[-4000:] + result.stderr[-2000:]

        assert stranger.wait(120) != 0 and no_ca.wait(120) != 0
        stranger_log, no_ca_log = (
            (fed.workdir / "supernode-stranger.log").read_text(),
            (fed.workdir / "supernode-no-ca.log").read_text(),
        )
        assert "Exit Code: 305" in stranger_log and "[code: 2004] Failed to activate SuperNode." in stranger_log, (
            stranger_log[-2000:]
        )
        superlink_log = (fed.workdir / "superlink.log").read_text()
        assert "No SuperNode found with the given public key" in superlink_log
        assert '"POST /v1/fleet/activate-node HTTP/1.1" 412' in superlink_log
        assert "Exit Code: 305" in no_ca_log and "CERTIFICATE_VERIFY_FAILED" in no_ca_log, no_ca_log[-2000:]
        cli_output, _ = cli.communicate(timeout=120)
        # Flower's CLI says no more than that it cannot reach the SuperLink (the same connection with
        # root-certificates is the one that started the run and lists the nodes below).
        assert cli.returncode != 0 and "Connection to the SuperLink is unavailable" in cli_output, cli_output[-2000:]

        # The SuperLink knows exactly the three registered SuperNodes, all online: neither stranger
        # became a node (the no-CA one, holding B's key, would have made B's node change hands).
        listed = fed.flwr("supernode", "list", CONNECTION, "--format", "json")
        nodes = json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]
        assert len(nodes) == 3 and {node["status"] for node in nodes} == {"online"}, listed.stdout

    for name in ("final.json", "history.csv", "model_best.pt", "predictions.npz"):
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name
