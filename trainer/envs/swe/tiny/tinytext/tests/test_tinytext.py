from tinytext import center, count_words, initials, is_palindrome, truncate


def test_truncate_keeps_short_text():
    assert truncate("hello", 5) == "hello"


def test_truncate_cuts_long_text():
    assert truncate("hello world", 8) == "hello..."


def test_count_words():
    assert count_words("  the quick  brown fox ") == 4


def test_count_words_empty():
    assert count_words("") == 0


def test_is_palindrome():
    assert is_palindrome("Never odd or even")


def test_is_not_palindrome():
    assert not is_palindrome("python")


def test_center_pads_both_sides():
    assert center("ab", 7, "*") == "**ab***"


def test_center_leaves_wide_text():
    assert center("abcdef", 3) == "abcdef"


def test_initials():
    assert initials("ada king lovelace") == "AKL"
