"""Small text helpers."""


def truncate(text, width, suffix="..."):
    """Cut ``text`` to at most ``width`` characters, ending with ``suffix`` when cut."""
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def count_words(text):
    """Number of whitespace-separated words."""
    return len(text.split())


def is_palindrome(text):
    """True when ``text`` reads the same backwards, ignoring case and spaces."""
    letters = [c.lower() for c in text if not c.isspace()]
    return letters == letters[::-1]


def center(text, width, fill=" "):
    """Pad ``text`` on both sides to ``width``; the extra fill goes to the right."""
    missing = width - len(text)
    if missing <= 0:
        return text
    left = missing // 2
    return fill * left + text + fill * (missing - left)


def initials(name):
    """'Ada King Lovelace' -> 'AKL'."""
    return "".join(part[0].upper() for part in name.split() if part)
