#!/usr/bin/env python3
"""Refresh the `--help` blocks in docs/cli.md from the built binary, so the page stays true:
every "### muser <cmd>" heading is followed by a fenced block holding `muser <cmd> --help`.
usage (from the repository root): scripts/gen-cli-doc.py BUILD_DIR/muser"""
import os, re, subprocess, sys

binary = sys.argv[1]
path = "docs/cli.md"
text = open(path, encoding="utf-8").read()


def help_of(cmd):
    args = [binary] + ([cmd] if cmd else []) + ["--help"]
    out = subprocess.run(args, capture_output=True, text=True)
    # the binary names the embedded model by its absolute path; the page names it from the repo
    return (out.stdout or out.stderr).rstrip("\n").replace(os.getcwd() + "/", "")


def refresh(m):
    cmd = m.group(1)
    return "### muser %s\n\n```\n%s\n```" % (cmd, help_of(cmd))


text = re.sub(r"### muser ([\w-]+)\n\n```\n.*?\n```", refresh, text, flags=re.S)
open(path, "w", encoding="utf-8").write(text)
