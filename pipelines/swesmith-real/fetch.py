#!/usr/bin/env python3
"""fetch.py INDEX PROJECT SHA256 OUT: the source distribution of PROJECT
whose SHA-256 is SHA256, found on the package index INDEX (PEP 503: the
file whose link carries that digest), checked, and unpacked into OUT
(its top directory stripped). The pin is the digest: a release re-uploaded
under the same version is refused, never used."""

import hashlib
import html.parser
import io
import os
import sys
import tarfile
import urllib.parse
import urllib.request

from common import INFRA


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.read()
    except OSError as error:
        print(f"{url}: {error}", file=sys.stderr)
        sys.exit(INFRA)


def main(index, project, pin, out):
    page = f"{index.rstrip('/')}/{project}/"
    parser = Links()
    parser.feed(get(page).decode())
    links = [link for link in parser.links if link.endswith(f"#sha256={pin}")]
    if not links:
        sys.exit(f"{page} lists no file with SHA-256 {pin}")
    url = urllib.parse.urljoin(page, links[0].split("#")[0])
    data = get(url)
    digest = hashlib.sha256(data).hexdigest()
    if digest != pin:
        sys.exit(f"{url}: SHA-256 {digest}, pinned {pin}")
    os.makedirs(out, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1]:
                continue
            member.name = parts[1]
            archive.extract(member, out, filter="data")
    print(f"{project}: {url.rsplit('/', 1)[-1]} ({len(data)} bytes, SHA-256 as pinned)")


if __name__ == "__main__":
    main(*sys.argv[1:])
