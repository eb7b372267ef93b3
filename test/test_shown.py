"""`mbfg_ros.shown`: outside strings as they may appear in a log line (ROS-free)."""

from mbfg_ros.shown import MAX_SHOWN, shown


def test_short_strings_are_unchanged():
    assert shown("crank") == "crank" and shown("") == "" and shown(3.5) == "3.5"
    assert shown("é ü 角") == "é ü 角"


def test_long_strings_are_cut_with_a_visible_marker():
    text = shown("x" * (1 << 20))
    assert text == "x" * MAX_SHOWN + f"…[+{(1 << 20) - MAX_SHOWN} chars]"
    assert shown("abcdef", limit=3) == "abc…[+3 chars]"


def test_control_characters_are_escaped_onto_one_line():
    """A newline or an escape sequence in a name cannot start a forged log line or recolour the terminal."""
    text = shown("a\nb\r\x1b[31mc\u2028d")
    assert "\n" not in text and "\r" not in text and "\x1b" not in text and "\u2028" not in text
    assert text == "a\\nb\\r\\x1b[31mc\\u2028d"


def test_sequences_show_their_first_items_and_how_many_more():
    assert shown(["a", "b"]) == "[a, b]"
    text = shown([str(i) for i in range(100_000)])
    assert len(text) < 2 * MAX_SHOWN and text.endswith("more]]") and text.startswith("[0, 1, 2")
    assert len(shown(["y" * 10**6, "z"])) < 2 * MAX_SHOWN
