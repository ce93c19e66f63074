"""What both images share: the build's output, reproducibility, the OCI layout, the content (exactly the
listed files, root-owned, read-only; the binary is the musl build and static; Debian's CA bundle), the
entrypoint and default command, and that the binary starts from the unpacked image as the image's user."""
import json
import subprocess
import tarfile

import pytest

NAMES = ("controller", "agent")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# path -> (mode, owner uid), regular files and symlinks only
FILES = {
    "warmpath-controller": {
        "etc/ssl/certs/ca-certificates.crt": (0o444, 0),
        "opt/warmpath/warmpath_filter.wasm": (0o444, 0),
        "usr/local/bin/warmpath-controller": (0o555, 0),
    },
    "warmpath-agent": {
        "etc/ssl/certs/ca-certificates.crt": (0o444, 0),
        "usr/local/bin/warmpath-agent": (0o555, 0),
    },
}


@pytest.fixture(params=NAMES)
def image(request):
    return request.getfixturevalue(f"{request.param}_image")


def test_build_printed_both_archive_paths(archives, rebuilt_archives):
    assert len(archives) == 2, archives
    assert len(rebuilt_archives) == 2, rebuilt_archives


@pytest.mark.parametrize("index", [0, 1], ids=NAMES)
def test_archive_is_named_for_the_chart_app_version(archives, tag, index):
    a = archives[index]
    assert a.name == f"warmpath-{NAMES[index]}-{tag}.oci.tar"
    assert a.stat().st_size > 0, a


def test_rebuild_gives_the_same_digest(image):
    """Same inputs, same image: the second build (a cargo no-op) must give the same manifest digest."""
    assert image.digest.startswith("sha256:"), image.digest
    assert image.rebuilt_digest == image.digest


def test_archive_reference_is_name_and_tag(image, tag):
    with tarfile.open(image.archive) as t:
        index = json.load(t.extractfile("index.json"))
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == f"{image.name}:{tag}"


def test_platform_is_linux_amd64(image):
    assert (image.config["os"], image.config["architecture"]) == ("linux", "amd64")


def test_manifest_is_one_layer_oci(image):
    assert image.manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert len(image.manifest["layers"]) == 1, image.manifest["layers"]


def test_files_are_exactly_these(image):
    got = {}
    for p in sorted(image.rootfs.rglob("*")):
        if p.is_symlink() or p.is_file():
            st = p.lstat()
            got[str(p.relative_to(image.rootfs))] = (st.st_mode & 0o7777, st.st_uid)
    assert got == FILES[image.name]


def test_binary_is_the_musl_build(image, target_dir):
    built = target_dir / "x86_64-unknown-linux-musl/image" / image.name
    assert (image.rootfs / image.binary.lstrip("/")).read_bytes() == built.read_bytes(), f"differs from {built}"


def test_binary_is_static(image):
    """FROM scratch has no dynamic loader: the binary must not ask for one."""
    headers = subprocess.run(["readelf", "-l", image.rootfs / image.binary.lstrip("/")],
                             check=True, capture_output=True, text=True).stdout
    assert "program interpreter" not in headers


def test_ca_bundle_is_debians(image):
    bundle = (image.rootfs / CA_BUNDLE.lstrip("/")).read_bytes()
    assert b"BEGIN CERTIFICATE" in bundle
    with open(CA_BUNDLE, "rb") as f:
        assert bundle == f.read()


def test_ssl_cert_file_names_the_bundle(image):
    assert image.env.get("SSL_CERT_FILE") == CA_BUNDLE


def test_entrypoint_is_the_binary(image):
    assert image.cfg["Entrypoint"] == [image.binary]


def test_default_cmd_is_run(image):
    """A plain `docker run` starts the controller / the agent's node loop too."""
    assert image.cfg.get("Cmd") == ["run"]


def test_version_runs_as_the_image_user(image, version):
    r = image.run(["--version"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == f"{image.name} {version}"
