"""The fetch step: each source file of a corpus downloaded (an interrupted download is resumed) or taken from
--archive, and checked against its published size and checksum before any step uses it.
"""
import os
import shutil
import urllib.error
import urllib.request

from textfiles import PrepareError, digest

# The published size and checksum of a source, by URL, enforced on every copy. WMT: tensorflow/datasets url_checksums/
# wmt{14,16,17}_translate.txt; WikiText: huggingface/datasets wikitext/dataset_infos.json; PTB (an md5 only):
# PaddlePaddle python/paddle/dataset/imikolov.py. Nothing is published for the other sources (data/README.md).
PUBLISHED = {
    "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz":
        (657632379, "sha256:0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7"),
    "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz":
        (918311367, "sha256:c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5"),
    "https://data.statmt.org/wmt16/translation-task/training-parallel-nc-v11.tgz":
        (75178032, "sha256:cfe8ab047e05043476e498ee765c98e939c7b7d6d294e856344c84476b619d6a"),
    "https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz":
        (168591139, "sha256:2b45f30ef1d550d302fd17dd3a5cbe19134ccc4c2cf50c2dae534aee600101a2"),
    "https://wikitext.smerity.com/wikitext-103-v1.zip":
        (190229076, "sha256:242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"),
    "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz": (None, "md5:30177ea32e27c525793142b6bf2c8e2d"),
}


def download(url, path):
    """URL -> PATH through PATH.part, which an interrupted download leaves behind for the next run to resume with an
    HTTP Range request (a server that ignores it sends the whole file again)."""
    part = path.with_name(path.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": f"bytes={have}-"}), timeout=60) as r:
            resumed = r.status == 206
            with open(part, "ab" if resumed else "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
            want = (have if resumed else 0) + int(r.headers.get("Content-Length", 0))
    except (urllib.error.URLError, OSError) as e:
        if getattr(e, "code", None) != 416:  # 416: the .part is whole already
            why = f"HTTP {e.code} {e.reason}" if hasattr(e, "code") else getattr(e, "reason", e)
            raise PrepareError(f"cannot download {url} ({why}); re-run to resume, or without internet, fetch it "
                               "elsewhere and pass --archive PATH") from None
        want = have
    if part.stat().st_size < want:  # urllib ends a cut connection quietly
        raise PrepareError(f"the download of {url} stopped at {part.stat().st_size} of {want} bytes; re-run to "
                           "resume it")
    part.replace(path)


def verify(path, url, downloaded):
    """The sha256 of PATH, once its size and checksum are those published for URL; a bad download is set aside as
    PATH.bad, so that the next run downloads it again."""
    size, want = PUBLISHED.get(url, (None, None))
    got_size = path.stat().st_size
    why = size is not None and got_size != size and f"has {got_size} bytes, not the published {size}"
    sha = digest(path, "sha256")
    if want and not why:
        algo, hexdigest = want.split(":")
        got = sha if algo == "sha256" else digest(path, algo)
        why = got != hexdigest and f"has {algo} {got}, not the published {hexdigest}"
    if why:
        fix = "pass --archive PATH to a good copy"
        if downloaded:
            path.replace(path.with_name(path.name + ".bad"))
            fix = f"it is set aside as {path.name}.bad: re-run to download it again, or {fix}"
        raise PrepareError(f"{path} {why} of {url} (truncated, corrupt or another version); {fix}")
    return sha


def fetch(prep, sources):
    """Step fetch: each NAME: URL of ``sources`` -> WORK/fetch/NAME, a link to the --archive file (a corpus of one
    source) or to NAME in the --archive folder (several), else to the download in WORK/archives/NAME; each verified,
    its sha256 in WORK/fetch/sources.sha256 (prepare.json records them)."""
    archive, one = prep.o.archive, len(sources) == 1
    paths = {name: (archive if one else archive / name) if archive else prep.work / "archives" / name
             for name in sources}
    for name, path in paths.items():
        if archive and not path.is_file():
            raise PrepareError(f"{path} is not a file (--archive: " + (f"a copy of {name})" if one else
                                                                       f"a folder holding {', '.join(sources)})"))

    def run(out):
        sums = []
        for name, url in sources.items():
            if not paths[name].exists():
                prep.log(f"downloading {url}")
                download(url, paths[name])
            sums.append(f"{verify(paths[name], url, downloaded=not archive)}  {paths[name].name}\n")
            os.symlink(paths[name], out / name)
        (out / "sources.sha256").write_text("".join(sums))
    return prep.step("fetch", run, params=f"archive={archive or ''}")
