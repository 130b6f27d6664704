"""The kernel census: where a program's time goes, kernel by kernel, against the roofline."""
