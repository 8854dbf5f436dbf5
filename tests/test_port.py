#!/usr/bin/python3
"""The vcpkg port in ports/elastic is a valid port, and its features switch dependencies for real.

    /usr/bin/python3 tests/test_port.py <source dir> [<scratch dir>]

vcpkg itself is not needed. Checked:
1. vcpkg.json validates against vcpkg's JSON schema (vcpkg-tool docs/vcpkg.schema.json, kept as
   data in tests/packaging/vcpkg/schema/), is laid out as `vcpkg format-manifest` writes it, and
   agrees with the project: version = config.hpp's, license = LICENSE, homepage = the GitHub
   REPO the portfile publishes from, the nccl feature on vcpkg's nccl port, every feature locked
   in the portfile (VCPKG_LOCK_FIND_PACKAGE_<Pkg>).
2. The published form of the portfile calls vcpkg_from_github with REPO, REF v<version> and
   SHA512 as vcpkg requires them (the two values a maintainer fills in).
3. scripts/vcpkg-overlay.sh writes an overlay port pinned to a commit of a clone (here: a scratch
   clone holding this working tree), and the portfile runs in CMake script mode on it with a
   MODEL of vcpkg's helpers and toolchain (tests/packaging/vcpkg/), once per feature set:
     core           nothing optional, though Gloo, libcurl, CUDA and NCCL are on this machine
     cuda           elastic::cuda, still no elastic::nccl (NCCL sits in the CUDA toolkit here)
     full           cuda, nccl (through a model of vcpkg's nccl port), gloo, etcd, tools
   Each: the source fetched from the clone by commit, configure (-G Ninja) with the features'
   locks, install, config and pkg-config fixups, vcpkg's post-build checks (a subset), and a
   consumer that find_package()s elastic from the result, checks which components and targets
   it has, builds and runs. Only `full` builds the tools.
4. With ELASTIC_TEST_REAL_VCPKG=1, `vcpkg` on PATH and VCPKG_ROOT set, a real
   `vcpkg install --overlay-ports` of elastic and of elastic[gloo]; otherwise that part is skipped.
Exits 0 when everything holds, 1 with one line per failed check, 77 when a tool it needs
(cmake, ninja, git, pkg-config, python3-jsonschema) is missing.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

failures = []
started = time.monotonic()


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def note(what):
    print(f"[{time.monotonic() - started:5.1f} s] {what}", flush=True)


def run(cmd, *, cwd=None, env=None, timeout=300):
    """Runs cmd; returns (exit code, stdout + stderr)."""
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout} s: {' '.join(cmd)}\n{e.stdout or ''}{e.stderr or ''}"


def tail(text, n=60):
    return "\n".join(text.splitlines()[-n:])


# --- 1. the manifest ----------------------------------------------------------------------------

def schema_validator(schema_dir):
    """A Draft-7 validator for vcpkg.schema.json whose $refs resolve to the files kept here."""
    import jsonschema
    schemas = {}
    for name in os.listdir(schema_dir):
        if name.endswith(".schema.json"):
            with open(os.path.join(schema_dir, name)) as f:
                s = json.load(f)
            schemas[s["$id"]] = s
    root = next(s for i, s in schemas.items() if i.endswith("/vcpkg.schema.json"))
    try:
        from referencing import Registry, Resource
        registry = Registry().with_resources((i, Resource.from_contents(s)) for i, s in schemas.items())
        return jsonschema.Draft7Validator(root, registry=registry)
    except ImportError:  # jsonschema < 4.18 (Debian 12: 4.10)
        resolver = jsonschema.RefResolver.from_schema(root, store=schemas)
        return jsonschema.Draft7Validator(root, resolver=resolver)


# The order `vcpkg format-manifest` writes (vcpkg-tool src/vcpkg/sourceparagraph.cpp,
# serialize_manifest): "$" fields first, sorted; then these; dependencies sorted by name,
# features by name; a dependency that is only a name is written as the string.
TOP_ORDER = ["name", "version-string", "version", "version-date", "version-semver", "port-version",
             "maintainers", "contacts", "summary", "description", "homepage", "documentation", "license",
             "supports", "builtin-baseline", "dependencies", "default-features", "features", "overrides"]
FEATURE_ORDER = ["description", "supports", "license", "dependencies"]
DEPENDENCY_ORDER = ["name", "host", "default-features", "features", "platform", "version>="]


def canonical(manifest):
    def ordered(obj, order):
        extra = sorted(k for k in obj if k.startswith("$"))
        rest = [k for k in obj if not k.startswith("$") and k not in order]
        return {k: obj[k] for k in extra + [k for k in order if k in obj] + rest}

    def dep(d):
        if isinstance(d, str):
            return d
        d = ordered(d, DEPENDENCY_ORDER)
        if "features" in d:
            d["features"] = sorted(d["features"], key=lambda f: f if isinstance(f, str) else f["name"])
        trivial = set(d) == {"name"}
        return d["name"] if trivial else d

    def deps(ds):
        return sorted((dep(d) for d in ds), key=lambda d: d if isinstance(d, str) else d["name"])

    m = ordered(manifest, TOP_ORDER)
    if "dependencies" in m:
        m["dependencies"] = deps(m["dependencies"])
    if "features" in m:
        feats = {}
        for name in sorted(m["features"]):
            f = ordered(m["features"][name], FEATURE_ORDER)
            if "dependencies" in f:
                f["dependencies"] = deps(f["dependencies"])
            feats[name] = f
        m["features"] = feats
    return json.dumps(m, indent=2, ensure_ascii=False) + "\n"


def check_manifest(src, port, schema_dir):
    path = os.path.join(port, "vcpkg.json")
    text = open(path).read()
    try:
        m = json.loads(text)
    except ValueError as e:
        check(False, f"vcpkg.json: {e}")
        return None
    validator = schema_validator(schema_dir)
    for e in sorted(validator.iter_errors(m), key=lambda e: list(e.path)):
        check(False, f"vcpkg.json does not validate against vcpkg.schema.json at {'/'.join(map(str, e.path)) or '(top)'}: {e.message}")
    # The schema is live: a field vcpkg does not know is refused.
    check(any(True for _ in validator.iter_errors(dict(m, **{"feature": {}}))),
          "vcpkg.schema.json accepted an unknown field: the schema check is not working")
    check(text == canonical(m), "vcpkg.json is not laid out as `vcpkg format-manifest` writes it "
                                "(field order, sorted dependencies and features, 2-space indent)")

    config = open(os.path.join(src, "include", "elastic", "config.hpp")).read()
    v = re.search(r'#define ELASTIC_VERSION_STRING "([0-9]+\.[0-9]+\.[0-9]+)"', config)
    check(v and m.get("version") == v.group(1), f"vcpkg.json: version {m.get('version')} != config.hpp's {v and v.group(1)}")
    lic = open(os.path.join(src, "LICENSE")).read()
    check(m.get("license") == "Apache-2.0" and "Apache License" in lic and "Version 2.0" in lic,
          f"vcpkg.json: license {m.get('license')!r} does not match LICENSE")

    def names(ds):
        return {d if isinstance(d, str) else d["name"] for d in ds}

    deps = m.get("dependencies", [])
    check({"boost-interprocess", "fmt"} <= names(deps), "vcpkg.json: boost-interprocess and fmt must be dependencies")
    host = {d["name"] for d in deps if isinstance(d, dict) and d.get("host")}
    check({"vcpkg-cmake", "vcpkg-cmake-config"} <= host, "vcpkg.json: vcpkg-cmake and vcpkg-cmake-config must be host dependencies")
    features = m.get("features", {})
    # Each feature and the vcpkg port it brings (nccl: vcpkg's ports/nccl, which checks for the
    # system NCCL; cuda: ports/cuda, which checks for the CUDA toolkit).
    expected = {"cuda": "cuda", "etcd": "curl", "gloo": "gloo", "nccl": "nccl", "tools": "cli11"}
    check(set(features) == set(expected), f"vcpkg.json: features {sorted(features)}, expected {sorted(expected)}")
    for name, port_dep in expected.items():
        check(port_dep in names(features.get(name, {}).get("dependencies", [])),
              f"vcpkg.json: feature {name} does not depend on vcpkg's {port_dep} port")
    nccl_self = [d for d in features.get("nccl", {}).get("dependencies", []) if isinstance(d, dict) and d["name"] == "elastic"]
    check(nccl_self and "cuda" in nccl_self[0].get("features", []), "vcpkg.json: feature nccl does not bring elastic[cuda]")
    check("linux" in features.get("nccl", {}).get("supports", ""),
          "vcpkg.json: feature nccl must say where it is supported (vcpkg's nccl port: linux & x64)")
    return m


# --- the portfile's text ------------------------------------------------------------------------

LOCKS = {"cuda": "CUDAToolkit", "etcd": "CURL", "gloo": "Gloo", "nccl": "NCCL"}


def check_portfile(src, port, manifest):
    pf = open(os.path.join(port, "portfile.cmake")).read()
    code = "\n".join(line.split("#", 1)[0] for line in pf.splitlines())
    block = re.search(r"vcpkg_check_features\((.*?)\)", code, re.S)
    if check(block, "portfile.cmake: no vcpkg_check_features"):
        words = block.group(1).split()
        check("INVERTED_FEATURES" not in words, "portfile.cmake: a feature is switched by an inverted (disable-only) option")
        pairs = dict(zip(words[words.index("FEATURES") + 1::2], words[words.index("FEATURES") + 2::2])) if "FEATURES" in words else {}
        for feature, pkg in LOCKS.items():
            check(pairs.get(feature) == f"VCPKG_LOCK_FIND_PACKAGE_{pkg}",
                  f"portfile.cmake: feature {feature} is not VCPKG_LOCK_FIND_PACKAGE_{pkg} (got {pairs.get(feature)})")
        check(pairs.get("tools") == "ELASTIC_BUILD_TOOLS", "portfile.cmake: feature tools is not ELASTIC_BUILD_TOOLS")
    # The lock acts on find_package(<Pkg>) calls: CMakeLists.txt must look for each that way.
    cml = open(os.path.join(src, "CMakeLists.txt")).read()
    for pkg in LOCKS.values():
        check(re.search(rf"^\s*find_package\({pkg}\b", cml, re.M),
              f"CMakeLists.txt: no find_package({pkg} ...) for VCPKG_LOCK_FIND_PACKAGE_{pkg} to lock")
    check("ENV{" not in code, "portfile.cmake: reads the environment, which is outside vcpkg's ABI hash")
    gh = re.search(r"vcpkg_from_github\((.*?)\)", pf, re.S)
    if check(gh, "portfile.cmake: no vcpkg_from_github for the published port"):
        repo = re.search(r"\bREPO\s+(\S+)\s*#.*TO FILL IN", gh.group(1))
        sha = re.search(r"\bSHA512\s+(\S+)\s*#.*TO FILL IN", gh.group(1))
        check(repo and sha, "portfile.cmake: REPO and SHA512 are not marked 'TO FILL IN' for the maintainer")
        if repo:
            check(manifest.get("homepage") == f"https://github.com/{repo.group(1)}",
                  f"vcpkg.json: homepage {manifest.get('homepage')} is not the REPO the portfile publishes from ({repo.group(1)})")
    dest = re.search(r"set\(ELASTIC_CMAKE_DIR \$\{CMAKE_INSTALL_DATADIR\}/([^)\s]+)\)", cml)
    fix = re.search(r"vcpkg_cmake_config_fixup\(\s*CONFIG_PATH\s+(\S+?)\s*\)", code)
    if check(dest and fix, "portfile.cmake / CMakeLists.txt: cannot find the config install directory or the fixup"):
        check(fix.group(1) == "share/" + dest.group(1),
              f"portfile.cmake: vcpkg_cmake_config_fixup(CONFIG_PATH {fix.group(1)}) but CMakeLists.txt installs into share/{dest.group(1)}")
    usage = open(os.path.join(port, "usage")).read()
    for feature in ("cuda", "nccl", "gloo", "etcd", "tools"):
        check(f"elastic[{feature}]" in usage, f"ports/elastic/usage: says nothing about elastic[{feature}]")
    check("find_package(elastic CONFIG REQUIRED" in usage and "elastic::elastic" in usage,
          "ports/elastic/usage: no find_package(elastic CONFIG REQUIRED) / elastic::elastic")
    check("no NCCL port" not in usage and "nccl port" in usage, "ports/elastic/usage: does not say NCCL comes through vcpkg's nccl port")


# --- 2. and 3. the portfile run with the model --------------------------------------------------

def model_dir(src):
    return os.path.join(src, "tests", "packaging", "vcpkg")


def run_portfile(src, port_dir, work, features, env=None, triplet_options=()):
    cmd = ["cmake", f"-DPORT_DIR={port_dir}", f"-DWORK={work}", f"-DFEATURES_ON={';'.join(features)}",
           f"-DTRIPLET_OPTIONS={';'.join(triplet_options)}", "-P", os.path.join(model_dir(src), "run_port.cmake")]
    rc, out = run(cmd, env=env, timeout=400)
    calls = ""
    if os.path.exists(os.path.join(work, "calls.txt")):
        calls = open(os.path.join(work, "calls.txt")).read()
    return rc, out, calls


def check_published_form(src, scratch):
    """The port as committed (no source-from-clone.cmake): vcpkg_from_github as vcpkg needs it."""
    work = os.path.join(scratch, "published")
    rc, out, calls = run_portfile(src, os.path.join(src, "ports", "elastic"), work, [])
    m = re.search(r"vcpkg_from_github REPO (\S+) REF (\S+) SHA512 (\S+) HEAD_REF (\S+)", calls)
    if check(m, f"the published portfile did not call vcpkg_from_github as the model accepts it:\n{tail(out)}"):
        version = json.load(open(os.path.join(src, "ports", "elastic", "vcpkg.json")))["version"]
        check(m.group(2) == f"v{version}", f"vcpkg_from_github REF is {m.group(2)}, expected the tag v{version}")
        check(m.group(3) == "0" or re.fullmatch(r"[0-9a-f]{128}", m.group(3)),
              f"vcpkg_from_github SHA512 is {m.group(3)}: neither vcpkg's placeholder 0 nor a SHA512")
        note(f"published form: vcpkg_from_github REPO {m.group(1)} REF {m.group(2)} SHA512 "
             f"{'0 (to fill in)' if m.group(3) == '0' else m.group(3)[:16] + '...'}")
    check(rc != 0 and "would download" in out, f"the published portfile went past vcpkg_from_github in the model:\n{tail(out)}")


def snapshot_clone(src, dest):
    """A git clone holding the working tree as it is now (tracked and untracked, not ignored)."""
    rc, listing = run(["git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard"])
    if rc == 0:
        files = [f for f in listing.split("\0") if f]
    else:  # not a git checkout: everything but build trees
        files = []
        for root, dirs, names in os.walk(src):
            rel = os.path.relpath(root, src)
            dirs[:] = [d for d in dirs if not (rel == "." and (d.startswith("build") or d == ".git"))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    for f in files:
        s = os.path.join(src, f)
        if os.path.isfile(s) or os.path.islink(s):
            os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
            shutil.copy2(s, os.path.join(dest, f), follow_symlinks=False)
    env = dict(os.environ, GIT_AUTHOR_NAME="test", GIT_AUTHOR_EMAIL="test@localhost",
               GIT_COMMITTER_NAME="test", GIT_COMMITTER_EMAIL="test@localhost")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "snapshot"]):
        rc, out = run(cmd, cwd=dest, env=env)
        if rc != 0:
            return None, f"{' '.join(cmd)}: {out}"
    rc, sha = run(["git", "rev-parse", "HEAD"], cwd=dest)
    return sha.strip(), ""


def lint_package(pkg, work, port_dir):
    """vcpkg-tool's post-build checks (src/vcpkg/postbuildlint.cpp) that apply to this port."""
    problems = []
    rel = []
    for root, dirs, names in os.walk(pkg):
        for d in dirs:
            if not os.listdir(os.path.join(root, d)):
                problems.append(f"empty directory {os.path.relpath(os.path.join(root, d), pkg)}")
        rel += [os.path.relpath(os.path.join(root, n), pkg) for n in names]
    if not any(r.startswith("include/") for r in rel):
        problems.append("no include/ directory")
    for bad in ("debug/include/", "debug/share/"):
        if any(r.startswith(bad) for r in rel):
            problems.append(f"files in {bad}")
    for r in rel:
        if r.endswith(".cmake") and re.match(r"(debug/)?(lib/)?cmake/", r):
            problems.append(f"misplaced CMake file {r} (belongs in share/elastic)")
        if r.endswith(".pc"):
            libs = any(re.match(r"Libs(\.private)?:\s*\S", line) for line in open(os.path.join(pkg, r)))
            if libs and not r.startswith(("lib/pkgconfig/", "debug/lib/pkgconfig/")):
                problems.append(f"{r} has Libs: and must be in lib/pkgconfig")
        if r.startswith("bin/") and r.endswith(".exe"):
            problems.append(f"executable {r} in bin/")
    if "share/elastic/copyright" not in rel:
        problems.append("no share/elastic/copyright")
    if os.path.exists(os.path.join(port_dir, "usage")) and "share/elastic/usage" not in rel:
        problems.append("the port's usage file is not installed in share/elastic")
    # Absolute paths into vcpkg's own directories (packages, buildtrees, installed, downloads).
    for r in rel:
        p = os.path.join(pkg, r)
        try:
            text = open(p, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue  # binaries: vcpkg checks them for the same paths; the tools carry none here
        if work in text:
            problems.append(f"{r} names an absolute path under {work}")
    return problems


def run_variant(src, scratch, port_dir, name, features, expect_files, env):
    work = os.path.join(scratch, name)
    installed = os.path.join(work, "installed", "x64-linux")
    os.makedirs(installed, exist_ok=True)
    if "nccl" in features:
        # What vcpkg's nccl port puts in the installed tree (a model: share/nccl's wrapper and FindNCCL).
        shutil.copytree(os.path.join(model_dir(src), "nccl-port"), installed, dirs_exist_ok=True)
    t0 = time.monotonic()
    rc, out, calls = run_portfile(src, port_dir, work, features, env=env,
                                  triplet_options=["-DCURL_NO_CURL_CMAKE=ON"])
    if not check(rc == 0, f"[{name}] the portfile failed in the model:\n{tail(out, 80)}"):
        return
    check("unused-variables" not in calls, f"[{name}] vcpkg_cmake_configure would warn of unused variables: "
                                            f"{re.findall(r'unused-variables (.*)', calls)}")
    check(re.search(r"^vcpkg_from_git URL file://\S+ REF [0-9a-f]{40}$", calls, re.M),
          f"[{name}] the overlay port did not fetch its commit with vcpkg_from_git:\n{calls}")
    pkg = os.path.join(work, "packages", "elastic_x64-linux")
    for problem in lint_package(pkg, work, port_dir):
        check(False, f"[{name}] vcpkg post-build check: {problem}")
    share = os.path.join(pkg, "share", "elastic")
    for f in ("Cuda", "Nccl", "Gloo", "Etcd", "Tools"):
        present = os.path.exists(os.path.join(share, f"elastic{f}Targets.cmake"))
        check(present == (f.lower() in expect_files),
              f"[{name}] elastic{f}Targets.cmake is {'there' if present else 'missing'}; "
              f"elastic[{f.lower()}] is {'on' if f.lower() in features else 'off'}")
    tools = sorted(os.listdir(os.path.join(pkg, "tools", "elastic"))) if os.path.isdir(os.path.join(pkg, "tools", "elastic")) else []
    check(tools == (["elastic-report", "elastic-run", "elastic-watchdog"] if "tools" in features else []),
          f"[{name}] tools/elastic holds {tools}")
    port_s = time.monotonic() - t0

    # vcpkg merges the package into the installed tree; a consumer uses it through the toolchain.
    shutil.copytree(pkg, installed, dirs_exist_ok=True)
    consumer = os.path.join(work, "consumer")
    on = [f for f in ("cuda", "nccl", "gloo", "etcd", "tools") if f in features]
    off = [f for f in ("cuda", "nccl", "gloo", "etcd", "tools") if f not in features]
    cfg = ["cmake", "-S", os.path.join(model_dir(src), "consumer"), "-B", consumer, "-G", "Ninja",
           "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_TOOLCHAIN_FILE={os.path.join(model_dir(src), 'toolchain.cmake')}",
           f"-D_VCPKG_INSTALLED_DIR={os.path.join(work, 'installed')}", "-DVCPKG_TARGET_TRIPLET=x64-linux",
           f"-DEXPECT_ON={';'.join(on)}", f"-DEXPECT_OFF={';'.join(off)}",
           f"-DWITH_VCPKG_FINDNCCL={'ON' if 'nccl' in features else 'OFF'}"]
    rc, out = run(cfg, env=env)
    if not check(rc == 0, f"[{name}] the consumer's find_package(elastic) failed:\n{tail(out)}"):
        return
    rc, out = run(["cmake", "--build", consumer], env=env)
    if not check(rc == 0, f"[{name}] the consumer did not build:\n{tail(out)}"):
        return
    rc, out = run([os.path.join(consumer, "consumer")], env=env)
    want = " ".join(f"{f}={int(f in features)}" for f in ("cuda", "nccl", "gloo", "etcd"))
    check(rc == 0 and want in out, f"[{name}] the consumer printed {out.strip()!r}, expected {want!r}")
    note(f"[{name}] elastic[{','.join(['core'] + features)}]: port {port_s:.1f} s, consumer ok: {out.strip()}")


def real_vcpkg(scratch, overlay):
    if not (os.environ.get("ELASTIC_TEST_REAL_VCPKG") == "1" and shutil.which("vcpkg") and os.environ.get("VCPKG_ROOT")):
        note("real vcpkg: skipped (needs ELASTIC_TEST_REAL_VCPKG=1, vcpkg on PATH and VCPKG_ROOT)")
        return
    root = os.path.join(scratch, "real-vcpkg")
    common = ["--classic", f"--overlay-ports={overlay}", f"--x-install-root={root}/installed",
              f"--x-buildtrees-root={root}/buildtrees", f"--x-packages-root={root}/packages"]
    for spec, gloo in (("elastic", False), ("elastic[gloo]", True)):
        rc, out = run(["vcpkg", "install", spec, "--recurse"] + common, timeout=3600)
        if check(rc == 0, f"real vcpkg: vcpkg install {spec} failed:\n{tail(out)}"):
            has = os.path.exists(os.path.join(root, "installed", "x64-linux", "share", "elastic", "elasticGlooTargets.cmake"))
            check(has == gloo, f"real vcpkg: after {spec}, elasticGlooTargets.cmake is {'there' if has else 'missing'}")
            note(f"real vcpkg: vcpkg install {spec} ok")


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    src = os.path.abspath(argv[1])
    missing = [t for t in ("cmake", "ninja", "git", "pkg-config") if not shutil.which(t)]
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        missing.append("python3-jsonschema")
    if missing:
        print(f"skipped: missing {', '.join(missing)}")
        return 77

    port = os.path.join(src, "ports", "elastic")
    schema_dir = os.path.join(model_dir(src), "schema")
    manifest = check_manifest(src, port, schema_dir)
    if manifest is None:
        print("\n".join(f"FAIL: {f}" for f in failures))
        return 1
    check_portfile(src, port, manifest)
    note("manifest: vcpkg.schema.json, format-manifest layout, project agreement checked")

    scratch_arg = argv[2] if len(argv) == 3 else None
    if scratch_arg:
        shutil.rmtree(scratch_arg, ignore_errors=True)
        os.makedirs(scratch_arg)
    scratch_ctx = tempfile.TemporaryDirectory(prefix="elastic-port-") if not scratch_arg else None
    scratch = os.path.realpath(scratch_arg or scratch_ctx.name)
    try:
        check_published_form(src, scratch)

        clone = os.path.join(scratch, "clone")
        sha, err = snapshot_clone(src, clone)
        if not check(sha, f"cannot make a scratch clone of the working tree: {err}"):
            raise RuntimeError
        overlay = os.path.join(scratch, "overlay")
        rc, out = run([os.path.join(clone, "scripts", "vcpkg-overlay.sh"), overlay])
        if not check(rc == 0, f"scripts/vcpkg-overlay.sh failed:\n{out}"):
            raise RuntimeError
        port_dir = os.path.join(overlay, "elastic")
        pin = open(os.path.join(port_dir, "source-from-clone.cmake")).read()
        check(f'"{sha}"' in pin and f'"file://{clone}"' in pin,
              f"the overlay does not pin commit {sha} of file://{clone}:\n{pin}")
        for f in os.listdir(port):
            check(open(os.path.join(port, f), "rb").read() == open(os.path.join(port_dir, f), "rb").read(),
                  f"the overlay's {f} differs from ports/elastic/{f}")
        note(f"overlay: {port_dir} pins {sha[:12]} of the scratch clone")

        env = dict(os.environ)
        env.pop("ELASTIC_WATCHDOG", None)
        # vcpkg's nccl port looks for NCCL through CUDA_PATH; a user with NCCL in the toolkit sets it.
        if os.path.exists("/usr/local/cuda/include/nccl.h"):
            env.setdefault("CUDA_PATH", "/usr/local/cuda")
        have_cuda = os.path.exists("/usr/local/cuda/bin/nvcc") or shutil.which("nvcc")
        have_nccl = os.path.exists(os.path.join(env.get("CUDA_PATH", "/usr/local/cuda"), "include", "nccl.h"))
        variants = [("core", [], [])]
        if have_cuda:
            variants.append(("cuda", ["cuda"], ["cuda"]))
        full = ["gloo", "etcd", "tools"] + (["cuda"] if have_cuda else []) + (["nccl"] if have_cuda and have_nccl else [])
        variants.append(("full", sorted(full), sorted(full)))
        if not have_cuda or not have_nccl:
            note("no CUDA toolkit / NCCL here: the cuda and nccl features are not switched on")
        for name, features, expect in variants:
            run_variant(src, scratch, port_dir, name, features, expect, env)
        real_vcpkg(scratch, overlay)
    except RuntimeError:
        pass
    finally:
        if scratch_ctx:
            scratch_ctx.cleanup()
        elif not failures:
            shutil.rmtree(scratch, ignore_errors=True)  # kept only to look at a failure

    print(f"vcpkg port: {'ok' if not failures else 'FAILED'} in {time.monotonic() - started:.0f} s "
          "(portfile run with a model of vcpkg's helpers and toolchain, tests/packaging/vcpkg)")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
