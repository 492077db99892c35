"""The CLI's bad-input contract, checked one way everywhere: exit 2, one line."""

from hyflash.cli import main


def exit_2(capsys, argv, *needles, quiet_stdout: bool = False):
    """main(argv) ends with status 2 and one line on stderr holding every needle; with
    quiet_stdout also nothing on stdout (e.g. a prompt is not echoed before its error)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    if quiet_stdout:
        assert captured.out == ""
    for needle in needles:
        assert needle in captured.err, captured.err
    return captured
