"""benchmarks/deepgemm_without_regex.py: its include scan finds what DeepGEMM's std::regex found (the
scan's C++ against the regex, compiled here with g++ on generated sources), and an edit whose text
is missing fails loudly."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import deepgemm_without_regex as dwr  # noqa: E402

# The scan as the edit writes it, between the two ends of the original loop body, collecting what the
# original passed on to its checks.
HARNESS = r'''
#include <random>
#include <regex>
#include <string>
#include <vector>
#include <cstdio>
static std::vector<std::string> with_regex(const std::string& code) {
    std::vector<std::string> out;
    const std::regex pattern(R"(#\s*include\s*[<"][^>"]+[>"])");
    for (std::sregex_iterator it(code.begin(), code.end(), pattern), end; it != end; ++it) out.push_back(it->str());
    return out;
}
static std::vector<std::string> scanned(const std::string& code) {
    std::vector<std::string> out;
SCAN
        out.push_back(include_str);
    }
    return out;
}
int main() {
    std::mt19937 rng(7);
    const std::vector<std::string> atoms = {"#", " ", "\n", "\t", "\r", "include", "inc", "<", ">", "\"", "a",
        "deep_gemm/x.cuh", "#include <deep_gemm/a.cuh>", "# include \"b.h\"", "#include", "<>", "\"\""};
    long differ = 0;
    for (int t = 0; t < 50000; ++t) {
        std::string s;
        for (int k = rng() % 12; k > 0; --k) s += atoms[rng() % atoms.size()];
        differ += with_regex(s) != scanned(s);
    }
    std::printf("%ld\n", differ);
}
'''


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_the_scan_finds_what_the_regex_found(tmp_path):
    scan = dwr.INCLUDE_SCAN_NEW.replace("        std::vector<std::string> includes;\n", "")
    src = tmp_path / "scan.cpp"
    src.write_text(HARNESS.replace("SCAN", scan))
    exe = tmp_path / "scan"
    subprocess.run(["g++", "-O1", "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True)
    assert subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.strip() == "0"


def _tree(tmp_path, include_parser: str, compiler: str) -> Path:
    jit = tmp_path / "csrc" / "jit"
    jit.mkdir(parents=True)
    (jit / "include_parser.hpp").write_text(include_parser)
    (jit / "compiler.hpp").write_text(compiler)
    return tmp_path


def test_the_edits_replace_every_regex(tmp_path):
    src = _tree(tmp_path, "#include <regex>\n" + dwr.INCLUDE_SCAN_OLD,
                dwr.VERSION_OLD + "        " + dwr.LOCAL_MEMORY_OLD + "\n")
    dwr.rewrite(src)
    assert "std::regex" not in (src / "csrc/jit/include_parser.hpp").read_text()
    assert (src / "csrc/jit/compiler.hpp").read_text() == dwr.VERSION_NEW + "        " + dwr.LOCAL_MEMORY_NEW + "\n"


def test_another_version_fails_loudly(tmp_path):
    src = _tree(tmp_path, "const std::regex pattern(R\"(#include)\");\n", dwr.VERSION_OLD + dwr.LOCAL_MEMORY_OLD)
    with pytest.raises(SystemExit, match="expected one copy"):
        dwr.rewrite(src)
