"""The recipes for tox, docker, apptainer and Slurm, and the documentation, stay complete and consistent.

No container engine, apptainer or Slurm runs on CI: .ci/container.sh runs the images' step list
(docker/install.sh) in a Debian root filesystem and Iris in it, and these checks catch what else can be
caught without them, beside .ci/static-checks' linters.
"""

import configparser
import re
from pathlib import Path

import pytest

import iris

ROOT = Path(__file__).resolve().parent.parent
MULTICAST_OFF = ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1")
RECIPES = (
    "tox.ini", "docker/Dockerfile", "docker/Dockerfile.rocm", "docker/build.sh", "docker/run.sh",
    "docker-compose.yml", "apptainer/iris.def", "apptainer/iris-rocm.def", "apptainer/build.sh",
    "apptainer/run.sh", "apptainer/conformance.slurm", "apptainer/multinode.slurm", "docker/install.sh",
    ".ci/container.sh",
)
GPU_PROGRAMS = ("docker/Dockerfile", "docker/Dockerfile.rocm", "apptainer/iris.def", "apptainer/iris-rocm.def",
                "apptainer/conformance.slurm", "apptainer/multinode.slurm")


def _text(path: str) -> str:
    return (ROOT / path).read_text()


def _documentation() -> str:
    return _text("README.md") + "".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def _settings(text: str) -> str:
    """Assignments with the spaces around '=' removed ("A = 1" and "A=1" read alike)."""
    return re.sub(r"\s*=\s*", "=", text)


@pytest.mark.parametrize("path", RECIPES)
def test_every_recipe_exists_and_is_referenced_from_the_documentation(path):
    assert (ROOT / path).is_file(), f"{path} is missing"
    assert path in _documentation(), f"{path} is not mentioned in README.md or docs/"


@pytest.mark.parametrize("path", GPU_PROGRAMS)
def test_gpu_recipes_keep_nvlink_multicast_off(path):
    text = _settings(_text(path))
    missing = [setting for setting in MULTICAST_OFF if setting not in text]
    assert not missing, f"{path} does not set {missing}"


def test_tox_has_one_environment_per_place_and_gpu_ones_keep_multicast_off():
    tox = _tox()
    for env in ("cpu", "sim", "gpu", "lint", "bench", "docs"):
        assert tox.has_section(f"testenv:{env}"), f"tox.ini has no [testenv:{env}]"
    base = _settings(tox["testenv"]["set_env"])
    for setting in MULTICAST_OFF:
        assert setting in base, f"tox.ini's [testenv] set_env lacks {setting}"
    for env in ("cpu", "sim"):  # environments that replace set_env must keep the base one
        assert "{[testenv]set_env}" in tox[f"testenv:{env}"]["set_env"], f"[testenv:{env}] drops the base set_env"
    assert "IRIS_BACKEND=cpu" in _settings(tox["testenv:cpu"]["set_env"])
    assert "IRIS_SIMULATION=1" in _settings(tox["testenv:sim"]["set_env"])
    assert "--ranks 4" in tox["testenv:cpu"]["commands"]


def test_tox_commands_name_only_files_that_exist():
    tox = _tox()
    named = set()
    for section in tox.sections():
        if tox.has_option(section, "commands"):
            named.update(re.findall(r"(?:benchmarks|examples)/[\w/]+\.py", tox[section]["commands"]))
    assert named, "tox.ini runs no benchmark or example"
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"tox.ini runs files that do not exist: {missing}"


def test_static_checks_cover_every_shell_script():
    listed = _text(".ci/static-checks")
    scripts = [p.relative_to(ROOT).as_posix() for folder in ("docker", "apptainer")
               for p in sorted((ROOT / folder).iterdir()) if p.suffix in (".sh", ".slurm")]
    missing = [script for script in scripts + [".ci/run", ".ci/container.sh"] if script not in listed]
    assert not missing, f".ci/static-checks does not check {missing}"


# Each image recipe, its flavour of docker/install.sh and the base image it names (Dockerfile: its ARG's default).
IMAGES = {
    "docker/Dockerfile": ("cuda", "CUDA_IMAGE"), "apptainer/iris.def": ("cuda", None),
    "docker/Dockerfile.rocm": ("rocm", "ROCM_IMAGE"), "apptainer/iris-rocm.def": ("rocm", None),
}


def _base_image(path: str) -> str:
    arg = IMAGES[path][1]
    pattern = rf"^ARG {arg}=(\S+)$" if arg else r"^From:\s*(\S+)$"
    return re.search(pattern, _text(path), re.MULTILINE).group(1)


@pytest.mark.parametrize("path", IMAGES)
def test_every_image_installs_through_the_one_step_list(path):
    """docker/install.sh is the only recipe that names a package: the images run it and install only Iris."""
    text = _text(path)
    flavour = IMAGES[path][0]
    assert re.search(rf"bash \S*docker/install\.sh {flavour}\b", text), \
        f"{path} does not run docker/install.sh {flavour}"
    assert "apt-get" not in text, f"{path} installs OS packages itself"
    pip_lines = [line.strip() for line in text.splitlines() if re.search(r"\bpip install\b", line)]
    assert all("--no-deps -e" in line for line in pip_lines), f"{path} installs Python packages itself: {pip_lines}"
    copied = "COPY docker/install.sh" if path.startswith("docker/") else "docker/install.sh /opt/iris/docker/install.sh"
    assert copied in text and "pyproject.toml" in text, f"{path} does not copy the step list and pyproject.toml"


@pytest.mark.parametrize("docker, apptainer", [("docker/Dockerfile", "apptainer/iris.def"),
                                                ("docker/Dockerfile.rocm", "apptainer/iris-rocm.def")])
def test_docker_and_apptainer_start_from_the_documented_base_image(docker, apptainer):
    image = _base_image(docker)
    assert _base_image(apptainer) == image, f"{apptainer} starts from another image than {docker} ({image})"
    assert f"`{image}`" in _text("docs/deployment.md"), f"docs/deployment.md does not name the base image {image}"


def test_the_step_list_takes_its_python_tools_from_pyproject_and_its_pins_are_documented():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    script = _text("docker/install.sh")
    extras = tomllib.loads(_text("pyproject.toml"))["project"]["optional-dependencies"]
    named = re.findall(r"\$\(extras ([\w ]+)\)", script)
    assert named, "docker/install.sh reads no extra of pyproject.toml"
    for extra in " ".join(named).split():
        assert extra in extras, f"docker/install.sh installs the extra {extra!r}, which pyproject.toml lacks"
    page = " ".join(_text("docs/deployment.md").split())
    for variable in ("TORCH_VERSION", "TRITON_VERSION"):
        default = re.search(rf"\${{{variable}:-([\d.]+)}}", script).group(1)
        assert f"{variable}` (default {default})" in page, f"docs/deployment.md does not give {variable}'s {default}"
    for flavour in ("cuda", "cpu", "rocm"):
        assert re.search(rf"^\s+{flavour}\)", script, re.MULTILINE), f"docker/install.sh has no {flavour} flavour"


def test_the_api_reference_names_every_public_function():
    reference = "".join(p.read_text() for p in sorted((ROOT / "docs" / "api").glob("*.md")))
    listed = set(re.findall(r"[\w.]+", reference))
    missing = [name for name in iris.__all__
               if not isinstance(getattr(iris, name), int) and name not in listed and f"iris.{name}" not in listed]
    assert not missing, f"docs/api/ does not render {missing}"


def test_the_benchmarks_page_shows_every_committed_plot():
    page = _text("docs/benchmarks.md")
    prefixes = re.findall(r"^<!-- plots (\S+) -->$", page, re.MULTILINE)
    plots = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.png"))
    unshown = [name for name in plots if not any(name.startswith(prefix) for prefix in prefixes)]
    assert not unshown, f"docs/benchmarks.md draws no plot for {unshown}: add a '<!-- plots PREFIX -->' line"


def test_tox_docs_installs_the_docs_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads(_text("pyproject.toml"))["project"]["optional-dependencies"]["docs"]
    deps = _tox()["testenv:docs"]["deps"].split()
    assert sorted(deps) == sorted(extra), f"tox.ini's [testenv:docs] deps {deps} differ from the docs extra {extra}"


def test_the_version_matrix_starts_at_pyprojects_lower_bound():
    """pyproject's oldest Triton is one CI tests (.ci/run and tox), and CI runs the suites cross-compiled."""
    lower = re.search(r'"triton>=([\d.]+)"', _text("pyproject.toml")).group(1)
    ci = _text(".ci/run")
    tested = re.search(r"for triton_version in ([\d. ]+);", ci).group(1).split()
    assert min(tested, key=lambda v: tuple(map(int, v.split(".")))).startswith(lower), (lower, tested)
    assert f"triton=={lower}" in " ".join(_tox()["testenv:cpu-triton{36,371,39}"]["deps"].split()).replace(
        ": ", ":"), "tox has no environment at the lowest supported Triton"
    assert "IRIS_CROSS_COMPILE=cuda:90,hip:gfx942" in ci
