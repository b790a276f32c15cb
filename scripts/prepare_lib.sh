# shellcheck shell=bash
# Shared machinery of scripts/prepare-*.sh (sourced, not run); data/README.md describes
# the checks, the steps and re-runs for users.
#
# Options of every script (parsed by pl_parse_args; <P> is the script's dataset: IWSLT14,
# WMT16, WMT14, IWSLT15, PTB or WT103):
#   --archive PATH|URL   a local archive (or folder) instead of the download; a URL
#                        (http[s]://, ftp://, file://) is downloaded. Env <P>_ARCHIVE
#   --url URL            download from URL instead of the default. Env <P>_URL
#   --sha256 HEX         expected sha256 of the archive. Env <P>_SHA256
#   --sha256-file FILE   expected checksums (`sha256sum` format, by file name). Env <P>_SHA256_FILE
#   --work DIR           working folder (default data/<name>)
#   --dest DIR           fairseq-preprocess output (default data/data-bin/<name>)
#   --bpe TYPE           subword-nmt or none
#   --bpe-size N         subword-nmt merges
#   --skip-size-check    go on when the split sizes differ from the published ones
#   --workers N          processes for the text steps and fairseq-preprocess (default: all cores)
#   --no-binarize        stop before fairseq-preprocess
#   --force              redo every step
#
# Downloads are checked before use (pl_verify): the kind of file, whole, then the sha256
# given, cited (PL_KNOWN_SHA256; PL_KNOWN_MD5 where only an md5 is published) or pinned on
# first use in WORK/archives/NAME.sha256.
# `pl_step NAME KEY FUNC ARGS...` runs FUNC with $STEP_OUT an empty OUT.tmp, renames it to
# OUT (WORK/NAME) when FUNC returns, and only then writes the marker WORK/.state/NAME.done
# (write-then-rename) with the step's KEY, a fresh id and the id of the step before it: a
# killed run never leaves a step marked done with partial output, a step is skipped only
# when KEY and the previous step's id match, so redoing one step redoes all after it.
# Failures stop with one line "ERROR: ..." naming the URL or file and what to do.

PL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PL_HELPER=$PL_REPO/scripts/prepare_text.py
declare -A PL_KNOWN_SHA256=() PL_KNOWN_BYTES=() PL_KNOWN_MD5=()

pl_log() { echo "[$PL_NAME] $*" >&2; }

pl_die() {
    PL_DIED=1
    echo "ERROR: [$PL_NAME] $*" >&2
    exit 1
}

pl_usage() {
    # The calling script's leading comment block, then the options every script has
    # (a word-level script, PL_BPE empty, has no --bpe options).
    sed -n '2,/^[^#]/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    echo
    sed -n '/^# Options of every script/,/^#$/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' \
        | if [ -n "$PL_BPE" ]; then cat; else sed '/--bpe/d'; fi
}

pl__unknown_option() {  # names the options --help lists
    local valid
    valid=$(pl_usage | sed -n 's/^ \{1,\}\(--[a-z0-9-]*\).*/\1/p' | awk '!seen[$0]++' | tr '\n' ' ')
    pl_die "unknown option '$1'; the options are: ${valid}--help"
}

pl__abs() { realpath -m -- "$1"; }

# --- options -------------------------------------------------------------------

# The calling script sets PL_NAME, PL_ENV (variable prefix), PL_DEFAULT_URL,
# PL_BPE and PL_BPE_SIZE (defaults; PL_BPE empty: a word-level corpus, no --bpe options),
# PL_DEST_NAME, and may define
# pl_script_option, which handles one script-specific option: it sets PL_SHIFT to
# the number of words it used and returns 0, or returns 1 for an unknown option.
pl_parse_args() {
    local v
    PL_CMDLINE="scripts/$(basename "$0")${*:+ $*}"
    for v in ARCHIVE URL SHA256 SHA256_FILE; do  # defaults from the environment, e.g. IWSLT14_URL
        local env=${PL_ENV}_$v
        printf -v "PL_$v" '%s' "${!env:-}"
    done
    PL_URL=${PL_URL:-$PL_DEFAULT_URL}
    PL_WORK=$PL_REPO/data/$PL_NAME
    PL_DEST=$PL_REPO/data/data-bin/$PL_DEST_NAME
    PL_WORKERS=$(nproc 2>/dev/null || echo 1)
    PL_BINARIZE=1
    PL_FORCE=0
    PL_SKIP_SIZE_CHECK=0
    PL_SIZE_CHECK="not run"
    while [ $# -gt 0 ]; do
        if [ -z "$PL_BPE" ] && { [ "$1" = --bpe ] || [ "$1" = --bpe-size ]; }; then pl__unknown_option "$1"; fi
        case $1 in
            -h|--help) pl_usage; exit 0 ;;
            --archive|--url|--sha256|--sha256-file|--work|--dest|--bpe|--bpe-size|--workers)
                [ $# -ge 2 ] || pl_die "option $1 needs a value (see --help)"
                v=${1#--}; v=${v//-/_}
                printf -v "PL_${v^^}" '%s' "$2"  # --sha256-file -> PL_SHA256_FILE, ...
                shift 2 ;;
            --no-binarize) PL_BINARIZE=0; shift ;;
            --skip-size-check) PL_SKIP_SIZE_CHECK=1; shift ;;
            --force) PL_FORCE=1; shift ;;
            *)
                PL_SHIFT=0
                if declare -F pl_script_option >/dev/null && pl_script_option "$@"; then
                    shift "$PL_SHIFT"
                else
                    pl__unknown_option "$1"
                fi ;;
        esac
    done
    if [ -n "$PL_BPE" ]; then
        case $PL_BPE in
            subword-nmt|none) ;;
            *) pl_die "--bpe must be subword-nmt or none, got '$PL_BPE'" ;;
        esac
        case $PL_BPE_SIZE in ''|*[!0-9]*) pl_die "--bpe-size must be a whole number, got '$PL_BPE_SIZE'" ;; esac
        if [ "$PL_BPE" != none ] && [ "$PL_BPE_SIZE" -eq 0 ]; then
            pl_die "--bpe-size must be over 0 for --bpe $PL_BPE (use --bpe none for no BPE)"
        fi
    fi
    case $PL_WORKERS in ''|*[!0-9]*|0) pl_die "--workers must be a positive number, got '$PL_WORKERS'" ;; esac
    if [ -n "$PL_SHA256" ]; then
        PL_SHA256=$(printf '%s' "$PL_SHA256" | tr 'A-F' 'a-f')
        [[ $PL_SHA256 =~ ^[0-9a-f]{64}$ ]] || pl_die "--sha256 must be 64 hex digits, got '$PL_SHA256'"
    fi
    # An --archive that is a URL is a download source.
    case $PL_ARCHIVE in
        http://*|https://*|ftp://*|file://*) PL_URL=$PL_ARCHIVE; PL_ARCHIVE= ;;
    esac
    [ -z "$PL_ARCHIVE" ] || PL_ARCHIVE=$(pl__abs "$PL_ARCHIVE")
    if [ -n "$PL_SHA256_FILE" ]; then
        PL_SHA256_FILE=$(pl__abs "$PL_SHA256_FILE")
        [ -f "$PL_SHA256_FILE" ] || pl_die "checksum list $PL_SHA256_FILE (--sha256-file) not found"
    fi
    PL_WORK=$(pl__abs "$PL_WORK")
    PL_DEST=$(pl__abs "$PL_DEST")
    export NORMPLUG_PREPARE_WORKERS=$PL_WORKERS
}

# --- tools ---------------------------------------------------------------------

pl__find_python() {
    if [ -n "${PYTHON:-}" ]; then
        PL_PY=$PYTHON
    elif [ -x "$PL_REPO/.venv/bin/python" ]; then
        PL_PY=$PL_REPO/.venv/bin/python
    else
        PL_PY=$(command -v python3) || pl_die "no python3 found; run 'make setup' or set PYTHON=/path/to/python"
    fi
}

pl_helper() { "$PL_PY" "$PL_HELPER" "$@"; }

pl_check_python_modules() {
    local mods="sacremoses regex"
    if [ "$PL_BPE" = subword-nmt ]; then mods="$mods subword_nmt"; fi
    "$PL_PY" -c "import ${mods// /, }" 2>/dev/null \
        || pl_die "$PL_PY lacks one of: $mods; run 'make setup' (or pip install -r requirements.txt), or set PYTHON to a python that has them"
}

pl_find_fairseq_preprocess() {
    # Sets PL_FSP: fairseq-preprocess next to the python in use (a venv's bin/),
    # else on PATH.
    if [ -n "${FAIRSEQ_PREPROCESS:-}" ]; then
        PL_FSP=$FAIRSEQ_PREPROCESS
    elif [ -x "$(dirname "$PL_PY")/fairseq-preprocess" ]; then
        PL_FSP=$(dirname "$PL_PY")/fairseq-preprocess
    elif command -v fairseq-preprocess >/dev/null 2>&1; then
        PL_FSP=$(command -v fairseq-preprocess)
    else
        pl_die "fairseq-preprocess is neither next to $PL_PY nor on PATH; run 'make setup', or pass --no-binarize"
    fi
}

# --- run-level set-up ----------------------------------------------------------

pl__on_exit() {
    local rc=$?
    # 65: prepare_text.py has printed its own ERROR line
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 65 ] && [ -z "${PL_DIED:-}" ] && [ -n "${PL_CURRENT:-}" ]; then
        echo "ERROR: [$PL_NAME] step $PL_CURRENT failed (exit $rc, see above); it is not marked done, re-run to retry" >&2
    fi
}

pl_begin() {
    pl__find_python
    pl_check_python_modules
    mkdir -p "$PL_WORK" || pl_die "cannot create the working folder $PL_WORK"
    PL_STATE=$PL_WORK/.state
    if [ "$PL_FORCE" = 1 ]; then
        rm -rf "$PL_STATE"
    fi
    mkdir -p "$PL_STATE" "$PL_WORK/archives"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$PL_WORK/.lock"
        flock -n 9 || pl_die "another prepare run is using $PL_WORK (lock $PL_WORK/.lock); wait for it or use another --work"
    fi
    if [ "$PL_BINARIZE" = 1 ]; then pl_find_fairseq_preprocess; fi
    trap pl__on_exit EXIT
    PL_PREV=start
    PL_T0=$SECONDS
    pl_log "work folder $PL_WORK, output $PL_DEST"
}

pl_finish() {
    PL_CURRENT=
    pl_log "all steps done in $((SECONDS - PL_T0))s"
}

# --- steps ---------------------------------------------------------------------

pl__marker_field() {  # FILE FIELD -> value
    local k v
    while IFS='=' read -r k v; do
        if [ "$k" = "$2" ]; then printf '%s\n' "$v"; return 0; fi
    done <"$1"
    return 1
}

# pl_step [--out DIR] NAME KEY FUNC [ARGS...]
pl_step() {
    local out=
    if [ "$1" = --out ]; then out=$2; shift 2; fi
    local name=$1 key=$2
    shift 2
    [ -n "$out" ] || out=$PL_WORK/$name
    local marker=$PL_STATE/$name.done tmp=$out.tmp
    mkdir -p "$(dirname "$out")"
    if [ -f "$marker" ] && [ -e "$out" ] \
        && [ "$(pl__marker_field "$marker" key)" = "$key" ] \
        && [ "$(pl__marker_field "$marker" parent)" = "$PL_PREV" ]; then
        PL_PREV=$(pl__marker_field "$marker" id)
        pl_log "step $name: done before, skipping"
        return 0
    fi
    PL_CURRENT=$name
    rm -f "$marker"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    pl_log "step $name: running"
    local t0=$SECONDS
    STEP_OUT=$tmp
    "$@"
    rm -rf "$out.old"
    if [ -e "$out" ] || [ -L "$out" ]; then mv -- "$out" "$out.old"; fi
    mv -- "$tmp" "$out"
    rm -rf "$out.old"
    local id
    id=$(date +%s%N)-$$-$RANDOM$RANDOM
    printf 'key=%s\nparent=%s\nid=%s\n' "$key" "$PL_PREV" "$id" >"$marker.tmp"
    mv -- "$marker.tmp" "$marker"
    PL_PREV=$id
    PL_CURRENT=
    pl_log "step $name: done ($((SECONDS - t0))s)"
}

# --- fetching ------------------------------------------------------------------

# pl_download URL DEST: download URL to DEST with curl (via DEST.part, resumed if present).
pl_download() {
    local url=$1 dest=$2 rc=0 hint
    hint="without internet, fetch it elsewhere and pass --archive PATH (or set ${PL_ENV}_ARCHIVE=PATH)"
    command -v curl >/dev/null 2>&1 || pl_die "downloading needs curl, which is not installed; $hint"
    mkdir -p "$(dirname "$dest")"
    pl_log "downloading $url"
    curl -fL --retry 2 --connect-timeout 30 --progress-bar -C - -o "$dest.part" "$url" || rc=$?
    if [ "$rc" = 33 ] || [ "$rc" = 36 ]; then  # the server cannot resume: start again
        rm -f "$dest.part"; rc=0
        curl -fL --retry 2 --connect-timeout 30 --progress-bar -o "$dest.part" "$url" || rc=$?
    fi
    [ "$rc" = 0 ] || pl_die "cannot download $url (curl exit $rc); $hint"
    [ -s "$dest.part" ] || { rm -f "$dest.part"; pl_die "download of $url came back empty; $hint"; }
    mv -- "$dest.part" "$dest"
}

# pl__expected_sha256 NAME [LOCAL_PATH]: the expected checksum of NAME, or nothing;
# prints "cited" after it when the value is the one the script cites.
pl__expected_sha256() {
    local name=$1 path=${2:-} h
    if [ -n "$PL_SHA256" ]; then printf '%s\n' "$PL_SHA256"; return; fi
    if [ -n "$PL_SHA256_FILE" ]; then
        h=$(awk -v n="$name" '{f=$2; sub(/^\*/, "", f); k=split(f, p, "/"); if (p[k] == n) {print tolower($1); exit}}' "$PL_SHA256_FILE")
        if [ -n "$h" ]; then printf '%s\n' "$h"; return; fi
    fi
    if [ -n "$path" ] && [ -f "$path.sha256" ]; then cut -d' ' -f1 "$path.sha256" | tr 'A-F' 'a-f'; return; fi
    if [ -n "${PL_KNOWN_SHA256[$name]:-}" ]; then printf '%s cited\n' "${PL_KNOWN_SHA256[$name]}"; return; fi
    if [ -f "$PL_WORK/archives/$name.sha256" ]; then cut -d' ' -f1 "$PL_WORK/archives/$name.sha256"; fi
}

# pl_verify FILE NAME KIND [DOWNLOADED]: is FILE what its step expects (KIND tgz:
# gzip-compressed tar; tar: any tar; zip; text: UTF-8 text), whole (`tar -t` reads it
# to the end; a zip's every member is read), of the cited size, with the expected
# checksum (or record it on first use)? A bad file that was downloaded is moved aside
# to FILE.bad so that the next run downloads afresh. The checksum goes into
# $STEP_OUT/sources.sha256.
pl_verify() {
    local file=$1 name=$2 kind=$3 downloaded=${4:-0} got want todo err why bytes cited= md5
    if [ "$downloaded" = 1 ]; then
        todo="it was downloaded from ${PL_SRC_URL:-?} and is now set aside as $file.bad; re-run to download it again, or pass --archive PATH to a good copy"
    else
        todo="pass --archive PATH to a good copy"
    fi
    pl__bad() {
        if [ "$downloaded" = 1 ]; then mv -f -- "$file" "$file.bad"; fi
        pl_die "$1"
    }
    [ -s "$file" ] || pl__bad "$file is empty; $todo"
    case $kind in
        tgz) why=$(pl_helper check-kind "$file" gzip) || pl__bad "$file $why; $todo" ;;
        tar|zip|text) why=$(pl_helper check-kind "$file" "$kind") || pl__bad "$file $why; $todo" ;;
        *) pl_die "pl_verify: unknown kind '$kind'" ;;
    esac
    want=$(pl__expected_sha256 "$name" "$([ "$downloaded" = 1 ] || printf '%s' "$file")")
    bytes=$(stat -L -c %s "$file")
    if [ "${want#* }" = cited ]; then
        cited=" (the published checksum)"
        if [ -n "${PL_KNOWN_BYTES[$name]:-}" ] && [ "$bytes" != "${PL_KNOWN_BYTES[$name]}" ]; then
            pl__bad "$file has $bytes bytes, the published $name has ${PL_KNOWN_BYTES[$name]} bytes (truncated, or another version); $todo"
        fi
    fi
    want=${want%% *}
    if [ "$kind" = tgz ] || [ "$kind" = tar ]; then
        if ! err=$(tar -tf "$file" 2>&1 >/dev/null); then
            err=$(printf '%s\n' "$err" | grep -v -e 'not recoverable' -e 'Child returned' -e '^[[:space:]]*$' | head -n1 || true)
            pl__bad "$file is corrupt or truncated (${err:-tar cannot read it to the end}); $todo"
        fi
    fi
    md5=${PL_KNOWN_MD5[$name]:-}
    if [ -z "$want" ] && [ -n "$md5" ]; then  # only an md5 is published: check it before pinning a sha256
        got=$(md5sum <"$file" | cut -d' ' -f1)
        [ "$got" = "$md5" ] || pl__bad "checksum mismatch for $file: md5 $got, expected $md5 (the published checksum; corrupt, or another version); $todo, or give the sha256 of a copy you trust with --sha256"
        pl_log "md5 of $name verified ($got)"
    fi
    got=$(sha256sum <"$file" | cut -d' ' -f1)
    if [ -n "$want" ]; then
        [ "$got" = "$want" ] || pl__bad "checksum mismatch for $file: sha256 $got, expected $want$cited (corrupt, or another version); $todo, or give the right value with --sha256 (a value pinned on first use is kept in $PL_WORK/archives/$name.sha256)"
        pl_log "sha256 of $name verified ($got)"
    else
        printf '%s  %s\n' "$got" "$name" >"$PL_WORK/archives/$name.sha256.tmp"
        mv -- "$PL_WORK/archives/$name.sha256.tmp" "$PL_WORK/archives/$name.sha256"
        pl_log "sha256 of $name is $got: recorded in $PL_WORK/archives/$name.sha256 (no expected value given; pass --sha256 to pin one)"
    fi
    printf '%s  %s\n' "$got" "$name" >>"$STEP_OUT/sources.sha256"
}

# pl_fetch_file NAME URL KIND: put a good copy of NAME in $STEP_OUT (as a link to
# the local --archive, or to the download in WORK/archives/).
pl_fetch_file() {
    local name=$1 url=$2 kind=$3 path
    if [ -n "$PL_ARCHIVE" ] && [ ! -d "$PL_ARCHIVE" ]; then
        [ -e "$PL_ARCHIVE" ] || pl_die "archive $PL_ARCHIVE not found (from --archive / ${PL_ENV}_ARCHIVE)"
        pl_verify "$PL_ARCHIVE" "$(basename "$PL_ARCHIVE")" "$kind"
        ln -s "$PL_ARCHIVE" "$STEP_OUT/$name"
        return
    fi
    if [ -n "$PL_ARCHIVE" ]; then  # a folder that holds the file
        path=$PL_ARCHIVE/$name
        [ -f "$path" ] || pl_die "$path not found (the --archive folder must hold $name)"
        pl_verify "$path" "$name" "$kind"
        ln -s "$path" "$STEP_OUT/$name"
        return
    fi
    path=$PL_WORK/archives/$name
    if [ ! -f "$path" ]; then
        pl_download "$url" "$path"
    else
        pl_log "using the earlier download $path"
    fi
    PL_SRC_URL=$url pl_verify "$path" "$name" "$kind" 1
    ln -s "$path" "$STEP_OUT/$name"
}

# The fetch step's key: where the data comes from and what it must hash to.
pl_fetch_key() {
    printf 'archive=%s url=%s sha256=%s sha256file=%s' "$PL_ARCHIVE" "$PL_URL" "$PL_SHA256" "$PL_SHA256_FILE"
}

# pl_extract ARCHIVE [SUBDIR]: unpack into $STEP_OUT[/SUBDIR].
pl_extract() {
    local to=$STEP_OUT${2:+/$2}
    mkdir -p "$to"
    tar -xf "$1" -C "$to" \
        || pl_die "cannot extract $1 (tar failed: corrupt or truncated archive, or the disk is full); delete it and fetch it again, or pass --archive PATH"
}

# pl_find_dir ROOT FILE: the folder under ROOT that holds FILE (for archives that
# may or may not wrap their files in a top folder).
pl_find_dir() {
    local hit
    hit=$(find -L "$1" -name "$2" -type f -print 2>/dev/null | LC_ALL=C sort | head -n1)
    [ -n "$hit" ] || return 1
    dirname "$hit"
}

pl_require_files() {  # DIR FILE... : each must exist
    local d=$1 f
    shift
    for f in "$@"; do
        [ -f "$d/$f" ] || pl_die "$d/$f is missing: the archive is not the expected one (${PL_ARCHIVE:-$PL_URL}); pass --archive PATH to the right archive"
    done
}

# pl_link SRC DEST: hard link when possible (same file system), else copy.
pl_link() { ln -f -- "$1" "$2" 2>/dev/null || cp -- "$1" "$2"; }

pl_check_aligned() { pl_helper check-aligned "$@"; }

# --- published sizes -------------------------------------------------------------

# pl_check_figures NAME GOT WANT UNIT [NAME GOT WANT UNIT ...]: each GOT must be WANT (a
# number, or LO-HI). A mismatch stops the run with both figures ("train has 315 pairs,
# published 160239"), unless --skip-size-check; PL_SIZE_CHECK records the outcome.
pl_check_figures() {
    local name got want unit lo hi bad=() good=() passed failed
    while [ $# -ge 4 ]; do
        name=$1 got=$2 want=$3 unit=$4
        shift 4
        lo=${want%-*}; hi=${want#*-}
        if [ "$got" -lt "$lo" ] || [ "$got" -gt "$hi" ]; then
            bad+=("$name has $got $unit, published $want")
        else
            good+=("$name $got $unit")
        fi
    done
    passed=$(printf '%s, ' "${good[@]}") failed=$(printf '%s; ' "${bad[@]}")
    passed=${passed%, } failed=${failed%; }
    if [ -z "$failed" ]; then
        PL_SIZE_CHECK=passed
        pl_log "sizes match the published ones: $passed"
    elif [ "$PL_SKIP_SIZE_CHECK" = 1 ]; then
        PL_SIZE_CHECK="skipped: $failed"
        pl_log "sizes differ from the published ones ($failed); going on (--skip-size-check)"
    else
        pl_die "sizes differ from the published ones: $failed (in ${PL_CHECKED:-$PL_WORK}); the source or a step is not the standard one; pass --skip-size-check to accept a deliberate change"
    fi
}

# pl_check_sizes DIR LANG SPLIT=N|SPLIT=LO-HI ...: DIR/SPLIT.LANG must have N lines (or LO..HI).
pl_check_sizes() {
    local dir=$1 lang=$2 spec figures=()
    shift 2
    for spec in "$@"; do
        figures+=("${spec%%=*}" "$(wc -l <"$dir/${spec%%=*}.$lang")" "${spec#*=}" pairs)
    done
    PL_CHECKED=$dir pl_check_figures "${figures[@]}"
}

# --- BPE and binarization -------------------------------------------------------

# step_bpe_learn DIR SRC TGT: learn the joint BPE on DIR/train.SRC + DIR/train.TGT
# (concatenated in that order, as `cat train.SRC train.TGT`)
# -> $STEP_OUT/code
step_bpe_learn() {
    pl_helper bpe-learn "$STEP_OUT/code" "$PL_BPE_SIZE" "$1/train.$2" "$1/train.$3"
}

# step_bpe_apply DIR SRC TGT: DIR/{train,valid,test}.{SRC,TGT} -> $STEP_OUT/
step_bpe_apply() {
    local dir=$1 args=() s l
    shift
    for s in train valid test; do
        for l in "$@"; do args+=("$dir/$s.$l" "$STEP_OUT/$s.$l"); done
    done
    pl_helper bpe-apply "$PL_WORK/bpe-learn/code" "${args[@]}"
    cp -- "$PL_WORK/bpe-learn/code" "$STEP_OUT/code"
}

# step_binarize DIR SRC TGT MANIFEST_EXTRA [fairseq-preprocess args...]: -> $STEP_OUT,
# with the BPE codes and prepare.json next to the dictionaries.
step_binarize() {
    local dir=$1 src=$2 tgt=$3 extra=$4 lc=${PL_LOWERCASED:-0}
    shift 4
    pl_find_fairseq_preprocess
    "$PL_FSP" --source-lang "$src" --target-lang "$tgt" \
        --trainpref "$dir/train" --validpref "$dir/valid" --testpref "$dir/test" \
        --destdir "$STEP_OUT" --joined-dictionary --workers "$PL_WORKERS" "$@" \
        || pl_die "fairseq-preprocess failed on $dir (see its messages above)"
    if [ -f "$dir/code" ]; then cp -- "$dir/code" "$STEP_OUT/"; fi
    pl__manifest manifest "$extra" --bpe "$PL_BPE" --bpe-size "$PL_BPE_SIZE" --lowercased "$lc" \
        --text-dir "$dir" --src "$src" --tgt "$tgt"
}

# pl__manifest COMMAND EXTRA ARGS...: $STEP_OUT/prepare.json by prepare_text.py COMMAND,
# with what every script records.
pl__manifest() {
    pl_helper "$1" "$STEP_OUT/prepare.json" --dataset "$PL_DATASET" --sources "$PL_WORK/fetch/sources.sha256" \
        --script "$PL_CMDLINE" --size-check "$PL_SIZE_CHECK" --extra "$2" "${@:3}" \
        || pl_die "cannot write $STEP_OUT/prepare.json"
}

# pl__binarize_step DIR KEY FUNC ARGS...: step binarize (FUNC on the text in DIR) into
# PL_DEST, unless --no-binarize.
pl__binarize_step() {
    local dir=$1
    shift
    if [ "$PL_BINARIZE" = 1 ]; then
        pl_step --out "$PL_DEST" binarize "$@"
    else
        pl_log "--no-binarize: the text for fairseq-preprocess is in $dir (no prepare.json is written)"
    fi
}

# pl_bpe_and_binarize DIR SRC TGT MANIFEST_EXTRA [fairseq-preprocess args...]: the
# common tail of every recipe: steps bpe-learn and bpe on DIR/{train,valid,test}
# (unless --bpe none, or PL_BPE_APPLIED=1: DIR holds text BPE'd already, with its
# codes in DIR/code), then (unless --no-binarize) step binarize into PL_DEST.
# MANIFEST_EXTRA is a JSON object of dataset-specific fields for prepare.json.
pl_bpe_and_binarize() {
    local dir=$1 src=$2 tgt=$3 extra=$4 bin_in=$1
    shift 4
    if [ "$PL_BPE" != none ] && [ "${PL_BPE_APPLIED:-0}" != 1 ]; then
        pl_step bpe-learn "type=$PL_BPE size=$PL_BPE_SIZE" step_bpe_learn "$dir" "$src" "$tgt"
        pl_step bpe "" step_bpe_apply "$dir" "$src" "$tgt"
        bin_in=$PL_WORK/bpe
    fi
    pl__binarize_step "$bin_in" "dest=$PL_DEST text=$bin_in args=$* extra=$extra sizes=$PL_SIZE_CHECK" \
        step_binarize "$bin_in" "$src" "$tgt" "$extra" "$@"
}

# --- language-model corpora -------------------------------------------------------

# step_lm_text ARCHIVE TRAIN VALID TEST: the three members of ARCHIVE (tar or zip), each
# UTF-8 text -> $STEP_OUT/{train,valid,test}, and their counts -> $STEP_OUT/stats (lm-stats).
step_lm_text() {
    local archive=$1 members=("$2" "$3" "$4") names=(train valid test) k why
    pl_helper extract-members "$archive" "$STEP_OUT" "$2" train "$3" valid "$4" test
    for k in 0 1 2; do
        why=$(pl_helper check-kind "$STEP_OUT/${names[k]}" text) || pl_die "${members[k]} in $archive $why"
    done
    pl_helper lm-stats "$STEP_OUT/stats" train="$STEP_OUT/train" valid="$STEP_OUT/valid" test="$STEP_OUT/test"
}

# pl_check_lm_sizes DIR LINES TOKENS VOCABULARY: DIR/stats (step_lm_text) against the
# published figures, LINES and TOKENS each "TRAIN VALID TEST".
pl_check_lm_sizes() {
    local dir=$1 lines tokens figures=() k v s i=0
    read -ra lines <<<"$2"
    read -ra tokens <<<"$3"
    declare -A got=()
    while read -r k v; do got[$k]=$v; done <"$dir/stats"
    for s in train valid test; do
        figures+=("$s" "${got[$s.lines]}" "${lines[$i]}" lines "$s" "${got[$s.tokens]}" "${tokens[$i]}" tokens)
        i=$((i + 1))
    done
    pl_log "tokens are counted as fairseq-preprocess and the published figures count them: the words and one end of sentence a line"
    PL_CHECKED=$dir pl_check_figures "${figures[@]}" train "${got[vocabulary]}" "$4" "words in its vocabulary (with the end of sentence)"
}

# step_binarize_lm DIR EXTRA: fairseq-preprocess --only-source on DIR/{train,valid,test}
# (the dictionary from train, as fairseq's examples/language_model) -> $STEP_OUT, with
# prepare.json (sizes from DIR/stats).
step_binarize_lm() {
    "$PL_FSP" --only-source --trainpref "$1/train" --validpref "$1/valid" --testpref "$1/test" \
        --destdir "$STEP_OUT" --workers "$PL_WORKERS" || pl_die "fairseq-preprocess failed on $1 (see its messages above)"
    pl__manifest lm-manifest "$2" --stats "$1/stats" --dict "$STEP_OUT/dict.txt"
}

# pl_lm_corpus ARCHIVE KIND TRAIN VALID TEST LINES TOKENS VOCABULARY EXTRA: the whole
# recipe of a language-model script: steps fetch (ARCHIVE, of KIND), text (its members
# TRAIN VALID TEST), the published sizes (see pl_check_lm_sizes), binarize.
pl_lm_corpus() {
    local text=$PL_WORK/text
    pl_step fetch "$(pl_fetch_key)" pl_fetch_file "$1" "$PL_URL" "$2"
    pl_step text "" step_lm_text "$(realpath -- "$PL_WORK/fetch/$1")" "$3" "$4" "$5"  # errors name the archive
    pl_check_lm_sizes "$text" "$6" "$7" "$8"
    pl__binarize_step "$text" "dest=$PL_DEST text=$text extra=$9 sizes=$PL_SIZE_CHECK" step_binarize_lm "$text" "$9"
}
