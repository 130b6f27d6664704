"""mkdocs hook: the site shows benches/RESULTS.md (and the charts it draws) as results.md, from where it lives."""

from pathlib import Path

from mkdocs.structure.files import File, Files


def on_files(files: Files, config) -> Files:
    root = Path(config.config_file_path).parent
    benches = root / "benches"
    files.append(File.generated(config, "results.md", abs_src_path=str(benches / "RESULTS.md")))
    for chart in sorted((benches / "charts").glob("*.svg")):
        files.append(File.generated(config, f"charts/{chart.name}", abs_src_path=str(chart)))
    return files
