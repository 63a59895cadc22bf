"""MkDocs hook: the generated result blocks in ``results.md`` are byte-for-byte copies of each experiment's
``summary.md``, written for the repository's root (their links start with ``docs/``); on the site they are
read from inside ``docs/``, so those links lose that prefix here, and only here."""


def on_page_markdown(markdown, page, config, files):
    depth = page.file.src_uri.count("/")
    return markdown.replace("](docs/", "](" + "../" * depth)
