"""Fixtures of the container image tests. scripts/test.d/58-image.sh builds the images (twice), reads and
unpacks them, then runs this directory:

    pytest tests/image --images DIR --target-dir TARGET --helm HELM

DIR holds `archives` and `rebuilt.archives` (scripts/build-image.sh's stdout of the two builds: the
controller archive's path, then the agent's) and, for NAME in controller and agent, `NAME/config.json`
(`skopeo inspect --config`), `NAME/manifest.json` (`--raw`), `NAME/digest` and `NAME/rebuilt.digest`
(`--format {{.Digest}}` of the two builds) and `NAME/bundle/rootfs` (`umoci unpack`). TARGET is the cargo
target directory the images were built from; HELM renders the chart.

The binaries run from the unpacked root filesystems with chroot, which needs root."""
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from support import REPO, ApiWithoutCrds, Image, RangedFiles, serving

OPTIONS = ("--images", "--target-dir", "--helm")


def pytest_addoption(parser):
    g = parser.getgroup("image", "container image tests (all required; see conftest.py)")
    g.addoption("--images", help="what scripts/test.d/58-image.sh prepared")
    g.addoption("--target-dir", help="the cargo target directory the images were built from")
    g.addoption("--helm", help="the helm binary")


def pytest_configure(config):
    missing = [o for o in OPTIONS if not config.getoption(o)]
    if missing:
        raise pytest.UsageError(f"missing {', '.join(missing)}: run scripts/test.d/58-image.sh (see tests/image/conftest.py)")
    if os.geteuid() != 0:
        raise pytest.UsageError("the image tests need root (chroot into the unpacked images)")


@pytest.fixture(scope="session")
def images_dir(pytestconfig) -> Path:
    return Path(pytestconfig.getoption("--images")).resolve()


@pytest.fixture(scope="session")
def target_dir(pytestconfig) -> Path:
    return Path(pytestconfig.getoption("--target-dir")).resolve()


@pytest.fixture(scope="session")
def tag() -> str:
    """The chart's appVersion: the images' tag."""
    return yaml.safe_load((REPO / "charts/warmpath/Chart.yaml").read_text())["appVersion"]


@pytest.fixture(scope="session")
def version() -> str:
    """The workspace version the binaries print."""
    return tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]


def _lines(path: Path) -> list:
    return path.read_text().splitlines()


@pytest.fixture(scope="session")
def archives(images_dir) -> list:
    return [Path(p) for p in _lines(images_dir / "archives")]


@pytest.fixture(scope="session")
def rebuilt_archives(images_dir) -> list:
    return [Path(p) for p in _lines(images_dir / "rebuilt.archives")]


def _image(images_dir: Path, archives: list, index: int, short: str) -> Image:
    d = images_dir / short
    return Image(
        name=f"warmpath-{short}",
        archive=archives[index],
        config=json.loads((d / "config.json").read_text()),
        manifest=json.loads((d / "manifest.json").read_text()),
        digest=(d / "digest").read_text().strip(),
        rebuilt_digest=(d / "rebuilt.digest").read_text().strip(),
        rootfs=d / "bundle/rootfs",
    )


@pytest.fixture(scope="session")
def controller_image(images_dir, archives) -> Image:
    return _image(images_dir, archives, 0, "controller")


@pytest.fixture(scope="session")
def agent_image(images_dir, archives) -> Image:
    return _image(images_dir, archives, 1, "agent")


# === the chart ===================================================================================

@pytest.fixture(scope="session")
def chart(pytestconfig) -> list:
    """`helm template` of the chart with the agent on: its objects."""
    out = subprocess.run([pytestconfig.getoption("--helm"), "template", "wp", str(REPO / "charts/warmpath"),
                          "--namespace", "warmpath-system", "--set", "agent.enabled=true"],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _named(docs: list, kind: str, suffix: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix))


@pytest.fixture(scope="session")
def controller_pod(chart) -> dict:
    return _named(chart, "Deployment", "-controller")["spec"]["template"]["spec"]


@pytest.fixture(scope="session")
def controller_container(controller_pod) -> dict:
    return next(c for c in controller_pod["containers"] if c["name"] == "controller")


@pytest.fixture(scope="session")
def controller_env(controller_container) -> dict:
    """The chart's literal env for the controller."""
    return {e["name"]: str(e["value"]) for e in controller_container["env"] if "value" in e}


@pytest.fixture(scope="session")
def agent_pod(chart) -> dict:
    return _named(chart, "DaemonSet", "-agent")["spec"]["template"]["spec"]


@pytest.fixture(scope="session")
def agent_container(agent_pod) -> dict:
    return next(c for c in agent_pod["containers"] if c["name"] == "agent")


# === loopback stand-ins ==========================================================================

@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Path:
    """A test CA with a server certificate for 127.0.0.1 (ca.crt, server.crt, server.key) and another CA
    that signed nothing here (other.crt)."""
    d = tmp_path_factory.mktemp("pki")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "1", "-subj", f"/CN=warmpath-test-{ca}",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "1", "-extfile", "ext.cnf", "-out", "server.crt")
    return d


@pytest.fixture
def api_server(pki):
    """A loopback HTTPS server (certificate from `pki`'s ca.crt) standing in for a Kubernetes API server
    without warmpath's CRDs: it answers 404 to everything. There is no Kubernetes API server on these
    machines (docs/image.md)."""
    with serving(ApiWithoutCrds, tls=(pki / "server.crt", pki / "server.key")) as srv:
        yield srv


@pytest.fixture(scope="session")
def www(tmp_path_factory) -> Path:
    """What the file servers serve."""
    return tmp_path_factory.mktemp("www")


@pytest.fixture(scope="session")
def file_server(www):
    """The Range-capable file server over plain HTTP, for the whole session (rendered pod specs name its
    port). Tests that read `requests` clear it first."""
    with serving(RangedFiles, root=www) as srv:
        yield srv


@pytest.fixture
def https_file_server(www, pki):
    """The same file server over HTTPS, certificate from `pki`'s ca.crt."""
    with serving(RangedFiles, tls=(pki / "server.crt", pki / "server.key"), root=www) as srv:
        yield srv
