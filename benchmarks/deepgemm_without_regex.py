"""Rewrites DeepGEMM's three uses of std::regex (in a source tree staged by benchmarks/stage_deepgemm.sh)
as plain string scans, same results: the include scan that keys its JIT cache, the NVCC version
parse and the optional local-memory check. On the GPU machine (2026-11-27) every call reaching
DeepGEMM's JIT segfaulted inside std::regex's compiler, in the include scan, before any compile;
without the regexes it segfaulted at the next locale use, and the cause was the extension's two
copies of the C++ runtime (benchmarks/stage_deepgemm.sh preloads the shared one). The build that
runs there and was measured is this one, regex-free.

    python benchmarks/deepgemm_without_regex.py SRC    # SRC holds csrc/jit/*.hpp

Each edit must find its text exactly once (DeepGEMM 54e2261, 2.6.1): another version fails here, loudly.
"""
from __future__ import annotations

import sys
from pathlib import Path

INCLUDE_SCAN_OLD = '''        std::vector<std::string> includes;
        const std::regex pattern(R"(#\\s*include\\s*[<"][^>"]+[>"])");
        std::sregex_iterator iter(code.begin(), code.end(), pattern);
        const std::sregex_iterator end;

        // TODO: parse relative paths as well
        for (; iter != end; ++ iter) {
            const auto include_str = iter->str();
'''
# What the pattern #\s*include\s*[<"][^>"]+[>"] matches, found by hand: a '#', blanks, "include",
# blanks, an opening '<' or '"', at least one character, the first '>' or '"' after it.
INCLUDE_SCAN_NEW = '''        std::vector<std::string> includes;
        const auto blank = [](const char c) { return c == ' ' or c == '\\t' or c == '\\n' or c == '\\r' or c == '\\f' or c == '\\v'; };
        for (size_t at = code.find('#'); at != std::string::npos; at = code.find('#', at + 1)) {
            size_t i = at + 1;
            while (i < code.size() and blank(code[i])) ++ i;
            if (code.compare(i, 7, "include") != 0)
                continue;
            i += 7;
            while (i < code.size() and blank(code[i])) ++ i;
            if (i >= code.size() or (code[i] != '<' and code[i] != '"'))
                continue;
            const size_t closing = code.find_first_of(">\\"", i + 1);
            if (closing == std::string::npos or closing == i + 1)
                continue;
            const auto include_str = code.substr(at, closing + 1 - at);
            at = closing;
'''
VERSION_OLD = '''        std::smatch match;
        DG_HOST_ASSERT(std::regex_search(output, match, std::regex(R"(release (\\d+\\.\\d+))")));
        std::sscanf(match[1].str().c_str(), "%d.%d", &major, &minor);
'''
VERSION_NEW = '''        const auto release = output.find("release ");
        DG_HOST_ASSERT(release != std::string::npos and std::sscanf(output.c_str() + release + 8, "%d.%d", &major, &minor) == 2);
'''
LOCAL_MEMORY_OLD = 'DG_HOST_ASSERT(not std::regex_search(output, std::regex(R"(Local memory used)")));'
LOCAL_MEMORY_NEW = 'DG_HOST_ASSERT(output.find("Local memory used") == std::string::npos);'

EDITS = {
    "csrc/jit/include_parser.hpp": [(INCLUDE_SCAN_OLD, INCLUDE_SCAN_NEW)],
    "csrc/jit/compiler.hpp": [(VERSION_OLD, VERSION_NEW), (LOCAL_MEMORY_OLD, LOCAL_MEMORY_NEW)],
}


def rewrite(src: Path) -> None:
    for rel, edits in EDITS.items():
        path = src / rel
        text = path.read_text()
        for old, new in edits:
            if text.count(old) != 1:
                raise SystemExit(f"{path}: expected one copy of the text to replace, found {text.count(old)} "
                                 "(another DeepGEMM version?)")
            text = text.replace(old, new)
        if "std::regex" in text:
            raise SystemExit(f"{path}: std::regex still used after the edits")
        path.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    rewrite(Path(sys.argv[1]))
    print(f"DeepGEMM sources in {sys.argv[1]}: std::regex replaced by string scans")
