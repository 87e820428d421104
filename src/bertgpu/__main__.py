"""`python -m bertgpu ...` is the same as the `bertgpu` console script."""

from bertgpu.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
