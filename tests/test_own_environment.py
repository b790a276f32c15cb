"""The README's "Using it from your own environment", as a GPU user runs it: a fresh venv holding only
torch (theirs), the README's pip lines, then fairseq-train with the plugin. Offline here: the venv's
fallback path (what --system-site-packages gives) holds this .venv's copies of exactly the packages that
normplug declares, with the fairseq extra, and what they require in turn; pip installs with --no-index,
fairseq from the wheel that scripts/setup-env.sh left in pip's cache. A package fairseq needs that the
extra does not declare is missing there, and the run fails."""
import importlib.metadata
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import REPO, TINY_MODEL

from normplug.tools.common import FAIRSEQ


def readme_pip_lines():
    """The `pip install` lines of the README's own-environment block, as argv lists."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Using it from your own environment")[1]
    block = section.split("```bash\n")[1].split("```")[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("pip install")]


def declared_closure(requires, extra):
    """The distributions of this .venv that ``requires`` (with ``extra``) names, and those they require in
    turn (with the extras asked of them)."""
    found, todo = {}, [(text, extra) for text in requires]  # name -> (distribution, extras asked of it)
    while todo:
        text, asked_by = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": asked_by or ""}):
            continue
        dist = importlib.metadata.distribution(req.name)  # the set-up installs every declared package
        assert req.specifier.contains(dist.version, prereleases=True), (text, dist.version)
        name = dist.metadata["Name"].lower().replace("_", "-")
        new = name not in found
        asked = found.setdefault(name, (dist, set()))[1]
        for wanted in [None] * new + sorted(req.extras - asked):
            todo += [(t, wanted) for t in dist.requires or []]
        asked |= req.extras
    return [dist for dist, _ in found.values()]


def fallback_site(dists, folder: Path) -> Path:
    """``folder`` holding links to the top-level files of ``dists`` (modules, packages, .dist-info)."""
    folder.mkdir()
    for dist in dists:
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        assert tops, f"{dist.metadata['Name']} lists no files"
        site = Path(dist.locate_file(""))
        for top in tops - {"__pycache__"}:
            if not (folder / top).exists() and not top.endswith(".pth"):
                (folder / top).symlink_to(site / top)
    return folder


def cached_fairseq_wheel() -> Path:
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout
    name = FAIRSEQ.replace("-", "_").replace("==", "-")
    wheels = sorted(Path(cache.strip() or "/nonexistent").glob(f"wheels/**/{name}-*.whl"))
    if not wheels:
        pytest.skip(f"no {name} wheel in pip's cache ({cache.strip()}): scripts/setup-env.sh builds one")
    return wheels[-1]


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the cached wheel is fairseq-fixed's, for Python >= 3.11")
def test_readme_pip_route_in_a_fresh_venv_trains(tmp_path, tiny_data):
    """A fresh venv, the README's pip lines (offline flags added), then fairseq-train --user-dir
    "$(normplug-path)" --arch transformer_iwslt_de_en_rbn for 2 updates with the RBN criterion."""
    extras, fairseq_line = readme_pip_lines()
    assert extras[:4] == ["pip", "install", "-e", ".[fairseq]"] and fairseq_line[-1] == FAIRSEQ, (extras, fairseq_line)
    egg = tmp_path / "egg"  # normplug's requirements as setup.py declares them now
    egg.mkdir()
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(egg)], cwd=REPO, check=True,
                   capture_output=True)
    requires = importlib.metadata.PathDistribution(egg / "normplug.egg-info").requires
    # pip too; not the setuptools that Python's venv bundles (65 on 3.11): torch's install replaced it
    dists = [importlib.metadata.distribution("pip"), *declared_closure(requires, "fairseq")]
    fallback = fallback_site(dists, tmp_path / "fallback")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (Path(next((venv / "lib").glob("python3.*/site-packages"))) / "fallback.pth").write_text(f"{fallback}\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

    def run(*argv, cwd=tmp_path, ok=True):
        proc = subprocess.run(list(map(str, argv)), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert (proc.returncode == 0) == ok, \
            f"{argv}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    python = venv / "bin" / "python"
    # the README's lines, in its order, from the repository root; offline: no index, no isolated build
    run(python, "-m", *extras, "--no-index", "--no-build-isolation", cwd=REPO)
    missing = run("normplug-tid", tmp_path / "any.pt", ok=False).stderr.splitlines()
    assert missing == [f"normplug-tid: error: normplug-tid needs fairseq, which does not import (ModuleNotFoundError: "
                       f"No module named 'fairseq'); install it: {shlex.join(fairseq_line)} (README: Using it "
                       "from your own environment)"]
    wheel = cached_fairseq_wheel()
    run(python, "-m", *fairseq_line, "--no-index", "--find-links", wheel.parent, cwd=REPO)
    where = run(python, "-c", "import fairseq, normplug; print(fairseq.__file__); print(normplug.__file__)")
    assert where.stdout.splitlines() == [str(venv / "lib" / f"python3.{sys.version_info[1]}" / "site-packages" /
                                          "fairseq" / "__init__.py"), str(REPO / "normplug" / "__init__.py")]

    train = ["fairseq-train", tiny_data, "--user-dir", "$(normplug-path)", "--arch", "transformer_iwslt_de_en_rbn",
             *TINY_MODEL, "--criterion", "label_smoothed_cross_entropy_rbn", "--label-smoothing", "0.1",
             "--rbn-mean-weight", "60", "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "400",
             "--max-update", "2", "--save-dir", tmp_path / "ckpt", "--log-format", "simple", "--log-interval", "1",
             "--no-progress-bar", "--num-workers", "0", "--data-buffer-size", "0"]
    log = run("bash", "-c", shlex.join(map(str, train)).replace("'$(normplug-path)'", '"$(normplug-path)"'))
    out = log.stdout + log.stderr
    assert "num_updates 2" in out and "rbn_penalty" in out and "done training" in out, out[-3000:]
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").is_file()


def test_normplug_path_prints_the_plugin_directory_and_has_help(capsys):
    from normplug.tools import path

    path.main([])
    assert capsys.readouterr().out == f"{REPO / 'normplug'}\n"
    with pytest.raises(SystemExit) as done:
        path.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: normplug-path") and "--user-dir" in out
    assert str(REPO) not in out
