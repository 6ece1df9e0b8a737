#!/usr/bin/env python3
"""Generates unicode_tables.inc for engine/model/unicode.cpp from UnicodeData.txt.

Run at build time (engine/model/unicode/unicode.cmake) so the tables always match the
Unicode Character Database installed on the build machine (Debian: unicode-data) and no
generated table is ever committed. Python standard library only.

Output (C++ source fragment, included inside namespace kvfs::unicode::tables):
  kRanges[]      {first code point, flags} sorted; a range runs to the next entry's start
  kLatin1[256]   flags of U+0000..U+00FF, the common case, without a search
  kLower[]       {code point, simple lower-case mapping} sorted by code point

Flag bits must match engine/model/unicode.h. They follow llama.cpp's unicode_cpt_flags:
one bit per general-category class plus a whitespace bit, because the pre-tokenizer
patterns only ask "is it \\p{L} / \\p{N} / \\p{P} / \\p{S} / \\p{M} / \\s".
"""

import argparse
import sys

FLAG_UNDEFINED = 0x0001    # Cn, and code points UnicodeData.txt does not list
FLAG_NUMBER = 0x0002       # \p{N}
FLAG_LETTER = 0x0004       # \p{L}
FLAG_SEPARATOR = 0x0008    # \p{Z}
FLAG_MARK = 0x0010         # \p{M}
FLAG_PUNCTUATION = 0x0020  # \p{P}
FLAG_SYMBOL = 0x0040       # \p{S}
FLAG_CONTROL = 0x0080      # \p{C}
FLAG_WHITESPACE = 0x0100   # \s

MAX_CODEPOINT = 0x110000

CATEGORY_FLAGS = {
    "Cn": FLAG_UNDEFINED,
    "Cc": FLAG_CONTROL, "Cf": FLAG_CONTROL, "Co": FLAG_CONTROL, "Cs": FLAG_CONTROL,
    "Ll": FLAG_LETTER, "Lm": FLAG_LETTER, "Lo": FLAG_LETTER, "Lt": FLAG_LETTER, "Lu": FLAG_LETTER,
    "Mc": FLAG_MARK, "Me": FLAG_MARK, "Mn": FLAG_MARK,
    "Nd": FLAG_NUMBER, "Nl": FLAG_NUMBER, "No": FLAG_NUMBER,
    "Pc": FLAG_PUNCTUATION, "Pd": FLAG_PUNCTUATION, "Pe": FLAG_PUNCTUATION,
    "Pf": FLAG_PUNCTUATION, "Pi": FLAG_PUNCTUATION, "Po": FLAG_PUNCTUATION,
    "Ps": FLAG_PUNCTUATION,
    "Sc": FLAG_SYMBOL, "Sk": FLAG_SYMBOL, "Sm": FLAG_SYMBOL, "So": FLAG_SYMBOL,
    "Zl": FLAG_SEPARATOR, "Zp": FLAG_SEPARATOR, "Zs": FLAG_SEPARATOR,
}

# llama.cpp's whitespace set (PropList White_Space). We derive it from the categories
# below and check it against this list, so a surprising UnicodeData.txt fails the build
# instead of silently changing how text is split.
LLAMA_WHITESPACE = sorted(
    list(range(0x09, 0x0E)) + list(range(0x2000, 0x200B)) +
    [0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])


def parse(path):
    """Yields (code point, category, simple lowercase or None) for every listed code point."""
    first = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            fields = line.split(";")
            if len(fields) != 15:
                sys.exit(f"{path}:{lineno}: expected 15 fields, got {len(fields)}")
            cp = int(fields[0], 16)
            name, cat, lower = fields[1], fields[2], fields[13]
            if cat not in CATEGORY_FLAGS or cp >= MAX_CODEPOINT:
                sys.exit(f"{path}:{lineno}: bad code point or category '{cat}'")
            lower_cp = int(lower, 16) if lower else None
            # Large blocks (CJK, Hangul, private use) are given as a First/Last pair.
            if name.endswith(", First>"):
                first = (cp, cat)
                continue
            if name.endswith(", Last>"):
                if first is None or first[1] != cat:
                    sys.exit(f"{path}:{lineno}: range end without a matching start")
                for c in range(first[0], cp):
                    yield c, cat, None
                first = None
            yield cp, cat, lower_cp


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input", required=True, help="path of UnicodeData.txt")
    ap.add_argument("--output", required=True, help="path of the .inc file to write")
    args = ap.parse_args()

    flags = [FLAG_UNDEFINED] * MAX_CODEPOINT
    lower = []
    count = 0
    for cp, cat, lower_cp in parse(args.input):
        flags[cp] = CATEGORY_FLAGS[cat]
        if lower_cp is not None and lower_cp != cp:
            lower.append((cp, lower_cp))
        count += 1
    if count < 100000:
        sys.exit(f"{args.input}: only {count} code points; is this UnicodeData.txt?")

    # White_Space = separators (Zs, Zl, Zp) + the C0/C1 controls TAB..CR and NEL.
    whitespace = [cp for cp in range(MAX_CODEPOINT) if flags[cp] == FLAG_SEPARATOR]
    whitespace = sorted(whitespace + list(range(0x09, 0x0E)) + [0x85])
    if whitespace != LLAMA_WHITESPACE:
        sys.exit("derived whitespace set differs from llama.cpp's: "
                 + ", ".join(f"U+{c:04X}" for c in sorted(set(whitespace) ^ set(LLAMA_WHITESPACE))))
    for cp in whitespace:
        flags[cp] |= FLAG_WHITESPACE

    ranges = [(0, flags[0])]
    for cp in range(1, MAX_CODEPOINT):
        if flags[cp] != ranges[-1][1]:
            ranges.append((cp, flags[cp]))

    out = []
    out.append("// Generated by engine/model/unicode/gen_unicode_tables.py from")
    out.append(f"// {args.input}. Do not edit; do not commit.")
    out.append(f"inline constexpr Range kRanges[] = {{  // {len(ranges)} ranges")
    for i in range(0, len(ranges), 6):
        out.append("    " + " ".join(f"{{0x{c:06X}, 0x{fl:04X}}}," for c, fl in ranges[i:i + 6]))
    out.append("};")
    out.append("inline constexpr uint16_t kLatin1[256] = {")
    for i in range(0, 256, 12):
        out.append("    " + " ".join(f"0x{flags[c]:04X}," for c in range(i, min(i + 12, 256))))
    out.append("};")
    out.append(f"inline constexpr CasePair kLower[] = {{  // {len(lower)} pairs")
    for i in range(0, len(lower), 6):
        out.append("    " + " ".join(f"{{0x{a:06X}, 0x{b:06X}}}," for a, b in lower[i:i + 6]))
    out.append("};")

    with open(args.output, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
