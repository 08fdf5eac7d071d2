# The course in a Linux container: the way to run it on macOS (Triton has no macOS wheels) or on any
# machine where you would rather not install into the host. Set-up is `make install`, the same
# target CI runs; torch comes from PyTorch's CPU index unless the container sees an NVIDIA driver.
#
#   docker build -t flashlib .
#   docker run --rm -p 8888:8888 flashlib            # then open the URL JupyterLab prints
#   docker run --rm flashlib make test               # the whole test suite, as CI runs it
FROM python:3.11-slim-bookworm

# make for the targets, bubblewrap for the grader's sandbox, git for a clean checkout's tools.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make bubblewrap git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /course
COPY pyproject.toml constraints.txt Makefile README.md ./
COPY tools/ tools/
COPY flashlib/ flashlib/
RUN make install
COPY . .

EXPOSE 8888
CMD ["make", "lab", "LAB_ARGS=--ip=0.0.0.0 --port=8888 --no-browser"]
