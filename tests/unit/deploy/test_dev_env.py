"""make run's var/dev.env: made once, and given the variables added since without changing any."""

from __future__ import annotations

from scripts.dev_env import main


def test_an_older_dev_env_gets_the_export_key_and_keeps_its_secrets(tmp_path, capsys):
    target = tmp_path / "dev.env"
    main(str(target))
    first = target.read_text()
    assert "AUDIT_EXPORT_KEY=" in first and (target.stat().st_mode & 0o777) == 0o600
    older = "".join(line + "\n" for line in first.splitlines() if not line.startswith("AUDIT_EXPORT_KEY="))
    target.write_text(older)
    main(str(target))
    assert target.read_text().startswith(older)  # nothing it had changed
    assert target.read_text().count("AUDIT_EXPORT_KEY=") == 1
    assert "added AUDIT_EXPORT_KEY" in capsys.readouterr().out
    main(str(target))
    assert target.read_text().count("\n") == first.count("\n")
