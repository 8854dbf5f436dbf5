#!/usr/bin/python3
"""The vcpkg port in ports/elastic agrees with the project and with vcpkg's manifest format.

    /usr/bin/python3 tests/test_port.py <source dir>

No vcpkg binary is needed (none is installed on the machines this runs on). Checked:
- vcpkg.json parses, uses only manifest fields vcpkg knows, and has the shapes vcpkg requires
  (name, version, dependencies as names or {name, host, features, platform, ...}, features with
  descriptions); its version is include/elastic/config.hpp's ELASTIC_VERSION_STRING; the
  required dependencies, host tools and features (cuda, nccl, gloo, etcd, tools) are there;
- its license is the SPDX id of the LICENSE file at the root;
- portfile.cmake: the build options that keep tests/examples/benchmarks out, a feature switch
  for each feature, vcpkg_cmake_config_fixup at the directory CMakeLists.txt installs the
  package config into, the tools copied, the copyright and usage installed; the REF/SHA512
  placeholders are marked as such;
- cmake -P accepts portfile.cmake's syntax (with vcpkg's functions stubbed).
Exits 0 when everything holds, 1 with one line per failed check.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


# Top-level fields of a vcpkg manifest (vcpkg-tool docs/vcpkg.schema.json).
MANIFEST_FIELDS = {"$schema", "$comment", "name", "version", "version-string", "version-semver", "version-date",
                   "port-version", "description", "maintainers", "homepage", "documentation", "license",
                   "supports", "dependencies", "default-features", "features", "builtin-baseline", "overrides",
                   "vcpkg-configuration"}
DEPENDENCY_FIELDS = {"$comment", "name", "host", "features", "default-features", "platform", "version>="}
FEATURE_FIELDS = {"$comment", "description", "dependencies", "supports", "license"}
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def check_dependencies(deps, where):
    names = []
    if not check(isinstance(deps, list), f"{where}: dependencies is not a list"):
        return names
    for d in deps:
        if isinstance(d, str):
            check(NAME_RE.match(d), f"{where}: dependency name {d!r} is not a valid port name")
            names.append(d)
        elif check(isinstance(d, dict) and "name" in d, f"{where}: dependency {d!r} is neither a name nor an object with name"):
            check(set(d) <= DEPENDENCY_FIELDS, f"{where}: dependency {d['name']} has unknown fields {set(d) - DEPENDENCY_FIELDS}")
            check(NAME_RE.match(d["name"]), f"{where}: dependency name {d['name']!r} is not a valid port name")
            check(isinstance(d.get("host", False), bool), f"{where}: {d['name']}.host is not a boolean")
            check(isinstance(d.get("features", []), list), f"{where}: {d['name']}.features is not a list")
            names.append(d["name"])
    return names


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = os.path.abspath(argv[1])
    port = os.path.join(src, "ports", "elastic")
    manifest_path = os.path.join(port, "vcpkg.json")
    try:
        m = json.load(open(manifest_path))
    except (OSError, ValueError) as e:
        print(f"FAIL: {manifest_path}: {e}")
        return 1

    check(set(m) <= MANIFEST_FIELDS, f"vcpkg.json: unknown fields {set(m) - MANIFEST_FIELDS}")
    check(m.get("name") == "elastic", f"vcpkg.json: name is {m.get('name')!r}")
    versions = [k for k in ("version", "version-string", "version-semver", "version-date") if k in m]
    check(versions == ["version"], f"vcpkg.json: expected exactly one version field, 'version'; got {versions}")
    config = open(os.path.join(src, "include", "elastic", "config.hpp")).read()
    v = re.search(r'#define ELASTIC_VERSION_STRING "([0-9]+\.[0-9]+\.[0-9]+)"', config)
    check(v and m.get("version") == v.group(1), f"vcpkg.json: version {m.get('version')} != config.hpp's {v and v.group(1)}")
    check(isinstance(m.get("port-version", 0), int), "vcpkg.json: port-version is not an integer")
    check(isinstance(m.get("description"), (str, list)), "vcpkg.json: no description")

    deps = check_dependencies(m.get("dependencies", []), "vcpkg.json")
    for needed in ("boost-interprocess", "fmt"):
        check(needed in deps, f"vcpkg.json: no dependency on {needed}")
    host = {d["name"] for d in m.get("dependencies", []) if isinstance(d, dict) and d.get("host")}
    check({"vcpkg-cmake", "vcpkg-cmake-config"} <= host, f"vcpkg.json: vcpkg-cmake and vcpkg-cmake-config must be host dependencies (have {host})")

    features = m.get("features", {})
    check(isinstance(features, dict), "vcpkg.json: features is not an object")
    expected = {"cuda": "cuda", "gloo": "gloo", "etcd": "curl", "nccl": None, "tools": "cli11"}
    for name, dep in expected.items():
        f = features.get(name)
        if not check(isinstance(f, dict), f"vcpkg.json: no feature {name}"):
            continue
        check(set(f) <= FEATURE_FIELDS, f"vcpkg.json: feature {name} has unknown fields {set(f) - FEATURE_FIELDS}")
        check(isinstance(f.get("description"), (str, list)) and f["description"], f"vcpkg.json: feature {name} has no description")
        fdeps = check_dependencies(f.get("dependencies", []), f"vcpkg.json feature {name}")
        if dep:
            check(dep in fdeps, f"vcpkg.json: feature {name} does not depend on {dep}")
        for d in f.get("dependencies", []):
            if isinstance(d, dict) and d["name"] == "elastic":
                for sub in d.get("features", []):
                    check(sub in features, f"vcpkg.json: feature {name} asks for elastic[{sub}], which does not exist")
    check("NCCL" in features.get("nccl", {}).get("description", "") and "FindNCCL" in features.get("nccl", {}).get("description", ""),
          "vcpkg.json: the nccl feature does not say that it uses the system NCCL through FindNCCL.cmake")
    for d in m.get("default-features", []):
        check((d if isinstance(d, str) else d.get("name")) in features, f"vcpkg.json: default feature {d} does not exist")

    # License: the SPDX id matches the file.
    lic_path = os.path.join(src, "LICENSE")
    if check(os.path.exists(lic_path), "no LICENSE at the repository root (the portfile installs it)"):
        text = open(lic_path).read()
        spdx = {"Apache-2.0": "Apache License" in text and "Version 2.0" in text,
                "MIT": "Permission is hereby granted, free of charge" in text}
        check(spdx.get(m.get("license"), False), f"vcpkg.json: license {m.get('license')!r} does not match LICENSE")

    # portfile.cmake against CMakeLists.txt.
    pf_path = os.path.join(port, "portfile.cmake")
    pf = open(pf_path).read()
    code = "\n".join(l.split("#", 1)[0] for l in pf.splitlines())  # comments out
    for opt in ("-DELASTIC_BUILD_TESTS=OFF", "-DELASTIC_BUILD_EXAMPLES=OFF", "-DELASTIC_BUILD_BENCHMARKS=OFF"):
        check(opt in code, f"portfile.cmake: vcpkg_cmake_configure lacks {opt}")
    check(re.search(r"\btools\s+ELASTIC_BUILD_TOOLS\b", code), "portfile.cmake: ELASTIC_BUILD_TOOLS does not follow the tools feature")
    feat_block = re.search(r"vcpkg_check_features\((.*?)\)", code, re.S)
    if check(feat_block, "portfile.cmake: no vcpkg_check_features"):
        words = feat_block.group(1).split()
        for name in ("cuda", "etcd", "nccl", "tools"):
            check(name in words, f"portfile.cmake: feature {name} switches nothing in vcpkg_check_features")
    cml = open(os.path.join(src, "CMakeLists.txt")).read()
    dest = re.search(r"set\(ELASTIC_CMAKE_DIR \$\{CMAKE_INSTALL_DATADIR\}/([^)\s]+)\)", cml)
    cfg = re.search(r"vcpkg_cmake_config_fixup\(\s*CONFIG_PATH\s+(\S+?)\s*\)", code)
    if check(dest and cfg, "portfile.cmake / CMakeLists.txt: cannot find the config install directory or the fixup"):
        check(cfg.group(1) == "share/" + dest.group(1),
              f"portfile.cmake: vcpkg_cmake_config_fixup(CONFIG_PATH {cfg.group(1)}) but CMakeLists.txt installs into share/{dest.group(1)}")
    check(re.search(r"vcpkg_copy_tools\(", code) and "elastic-watchdog" in code and "elastic-run" in code,
          "portfile.cmake: elastic-run / elastic-watchdog are not copied with vcpkg_copy_tools")
    check("vcpkg_install_copyright(" in code and "LICENSE" in code, "portfile.cmake: the license is not installed")
    check(os.path.exists(os.path.join(port, "usage")) and "usage" in code, "portfile.cmake / ports/elastic/usage: no usage file installed")
    check("debug/include" in code, "portfile.cmake: debug/include is not removed")
    check(re.search(r"SHA512 0\s+#.*TO BE FILLED", pf) is not None, "portfile.cmake: the SHA512 placeholder is not marked")
    tools_cml = open(os.path.join(src, "tools", "CMakeLists.txt")).read()
    check("RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}" in tools_cml,
          "tools/CMakeLists.txt does not install tools into bin/, where vcpkg_copy_tools looks")

    # cmake -P walks the portfile with vcpkg's functions stubbed: every feature on and the
    # install producing each feature's targets file; then cuda on with nothing produced, which
    # the portfile must refuse.
    cmake = shutil.which("cmake")
    if cmake:
        def walk(features, produce):
            with tempfile.TemporaryDirectory() as d:
                driver = os.path.join(d, "driver.cmake")
                touch = " ".join(f'"{d}/pkg/share/cmake/elastic/{f}"' for f in produce)
                with open(driver, "w") as f:
                    f.write(f'''
cmake_minimum_required(VERSION 3.21)  # vcpkg runs portfiles with modern policies (IN_LIST)
set(VERSION "{m.get("version")}")
set(PORT elastic)
set(FEATURES {" ".join(features)})
set(CURRENT_PACKAGES_DIR "{d}/pkg")
set(ENV{{ELASTIC_SOURCE_DIR}} "{src}")
foreach(fn vcpkg_from_github vcpkg_cmake_configure vcpkg_cmake_config_fixup
           vcpkg_fixup_pkgconfig vcpkg_copy_tools vcpkg_install_copyright)
  cmake_language(EVAL CODE "function(${{fn}})\\n  set_property(GLOBAL APPEND PROPERTY calls ${{fn}})\\nendfunction()")
endforeach()
function(vcpkg_cmake_install)
  set_property(GLOBAL APPEND PROPERTY calls vcpkg_cmake_install)
  file(MAKE_DIRECTORY "{d}/pkg/share/cmake/elastic")
  foreach(f IN ITEMS {touch})
    file(TOUCH "${{f}}")
  endforeach()
endfunction()
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 a "" "OUT_FEATURE_OPTIONS" "FEATURES;INVERTED_FEATURES")
  set(${{a_OUT_FEATURE_OPTIONS}} "-DX=ON" PARENT_SCOPE)
  set_property(GLOBAL APPEND PROPERTY calls vcpkg_check_features)
endfunction()
include("{pf_path}")
get_property(c GLOBAL PROPERTY calls)
message(STATUS "calls: ${{c}}")
''')
                r = subprocess.run([cmake, "-P", driver], capture_output=True, text=True, timeout=60)
                return r.returncode, r.stdout + r.stderr, os.path.exists(os.path.join(d, "pkg", "share", "elastic", "usage"))

        rc, out, usage = walk(["core", "cuda", "etcd", "gloo", "nccl", "tools"],
                              ["elasticCudaTargets.cmake", "elasticEtcdTargets.cmake", "elasticGlooTargets.cmake",
                               "elasticNcclTargets.cmake"])
        check(rc == 0, f"cmake -P with the portfile failed:\n{out}")
        calls = re.search(r"calls: (.*)", out)
        if check(calls, f"cmake -P: no call trace:\n{out}"):
            seq = calls.group(1).split(";")
            want = ["vcpkg_check_features", "vcpkg_cmake_configure", "vcpkg_cmake_install",
                    "vcpkg_cmake_config_fixup", "vcpkg_copy_tools", "vcpkg_install_copyright"]
            check([c for c in seq if c in want] == want, f"portfile.cmake: the vcpkg steps run as {seq}, expected the order {want}")
        check(usage, "portfile.cmake: usage is not installed into share/elastic")
        rc, out, _ = walk(["core", "cuda"], [])
        check(rc != 0 and "elastic[cuda]" in out, f"portfile.cmake: accepts elastic[cuda] when no elastic::cuda was built:\n{out}")
        rc, out, _ = walk(["core"], [])
        check(rc == 0, f"portfile.cmake: fails for the core package:\n{out}")
    else:
        print("note: cmake not found; portfile.cmake not run")

    print("vcpkg port: " + ("ok" if not failures else "FAILED"))
    print("note: no vcpkg binary here; the port was checked, not built by vcpkg")
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
