"""The command line's CSV reader (mbfg_ros.cli.csvio): missing cells, infinite cells, time stamps."""

import math

import numpy as np
import pytest

from mbfg_ros.cli import csvio
from mbfg_ros.cli.csvio import CsvError


def table(tmp_path, text, name="x.csv"):
    path = tmp_path / name
    path.write_text(text)
    return csvio.read_table(path)


def test_empty_and_nan_cells_are_missing_values(tmp_path):
    tab = table(tmp_path, "t,a,b\n0,1,nan\n0.001,,NaN\n0.002,-nan,2\n0.003,3,NAN\n")
    a, b = tab.column("a"), tab.column("b")
    assert a[0] == 1.0 and math.isnan(a[1]) and math.isnan(a[2]) and a[3] == 3.0
    assert np.isnan(b[[0, 1, 3]]).all() and b[2] == 2.0
    assert csvio.missing_cell(tab, ["a", "b"]) == "row 2, column 'b'"      # row 2 of the file: the first data row
    assert csvio.missing_cell(tab, ["a"]) == "row 3, column 'a'"


@pytest.mark.parametrize("cell", ["inf", "-inf", "Infinity", "1e999"])
def test_an_infinite_cell_is_an_error_naming_row_and_column(tmp_path, cell):
    with pytest.raises(CsvError) as err:
        table(tmp_path, f"t,a\n0,1\n0.001,{cell}\n")
    assert "x.csv: row 3, column 'a': not a finite number" in str(err.value)
    assert "empty cell or nan" in str(err.value)


@pytest.mark.parametrize("cell", ["", "nan"])
def test_a_missing_time_is_an_error(tmp_path, cell):
    with pytest.raises(CsvError, match=r"row 3, column 't': the time is missing"):
        table(tmp_path, f"t,a\n0,1\n{cell},2\n")


def test_time_going_backwards_or_repeating_names_the_row(tmp_path):
    with pytest.raises(CsvError, match=r"x.csv: row 4: time goes backwards \(t = 0.0005 s after 0.001 s at row 3"):
        table(tmp_path, "t,a\n0,1\n0.001,2\n0.0005,3\n")
    with pytest.raises(CsvError, match=r"x.csv: row 5: time t = 0.002 s repeats row 4's"):
        table(tmp_path, "t,a\n0,1\n0.001,2\n0.002,3\n0.002,4\n")


def test_jittered_stamps_are_read_as_they_are_and_their_step_is_the_median(tmp_path):
    t = [0.0, 0.00101, 0.00202, 0.00472, 0.00573, 0.00674]      # drift 1 %, one sample 2.7 steps late
    tab = table(tmp_path, "t,a\n" + "".join(f"{x},{i}\n" for i, x in enumerate(t)))
    np.testing.assert_array_equal(tab.t, t)
    assert csvio.median_step(tab) == pytest.approx(0.00101)
    with pytest.raises(CsvError, match="uniform"):           # what the batch inverse dynamics still needs
        csvio.require_uniform_time(tab)


def test_interpolation_skips_missing_cells(tmp_path):
    tab = table(tmp_path, "t,u\n0,0\n1,nan\n2,2\n3,\n4,8\n")
    np.testing.assert_allclose(csvio.interpolate(tab, ["u"], np.array([1.0, 2.5, 3.0, 5.0]))[:, 0],
                               [1.0, 3.5, 5.0, 8.0])
