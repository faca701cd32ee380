"""Build workflow/dvc/offline.html: DVC's plot page with vega, vega-lite and vega-embed
inlined, so that `dvc plots show --html-template workflow/dvc/offline.html` renders without
network (DVC's own page loads them from cdn.jsdelivr.net).

    cd /tmp && npm pack vega@5.20.2 vega-lite@5.2.0 vega-embed@6.18.2   # the versions DVC 3 loads
    python workflow/dvc/build_offline_template.py /tmp/vega-5.20.2.tgz /tmp/vega-lite-5.2.0.tgz \
        /tmp/vega-embed-6.18.2.tgz
"""

import json
import sys
import tarfile
from pathlib import Path

OUT = Path(__file__).with_name("offline.html")
# DVC's page (dvc_render.html.PAGE_HTML) with the CDN {scripts} replaced by the inlined libraries.
PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>DVC Plot</title>
{libraries}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def library(tgz: str) -> str:
    """The package's minified browser build as an inline <script>, with its name, version and license."""
    with tarfile.open(tgz) as tar:
        package = json.load(tar.extractfile("package/package.json"))
        name = package["name"]
        code = tar.extractfile(f"package/build/{name}.min.js").read().decode()
    if "</script" in code.lower() or "{plot_divs}" in code or "{scripts}" in code:
        raise SystemExit(f"{tgz}: cannot be inlined")
    header = f"{name} {package['version']} ({package['license']} license, https://www.npmjs.com/package/{name})"
    return f"    <!-- {header} -->\n    <script>{code}</script>"


if __name__ == "__main__":
    OUT.write_text(PAGE.format(libraries="\n".join(library(t) for t in sys.argv[1:])), encoding="utf8")
    print(f"{OUT}: {OUT.stat().st_size / 1e6:.2f} MB")
