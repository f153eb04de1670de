"""Each supported format is parsed into a title and blocks under their heading path."""

import io

import docx
import pytest
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from knowledge.ingest.parsing import CorruptDocument, UnsupportedFormat, parse_document


def make_pdf(title: str, sections: list[tuple[str, str]]) -> bytes:
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=A4)
    pdf.setTitle(title)
    y = 800
    for page in range(2):
        pdf.setFont("Helvetica", 8)
        pdf.drawString(40, 20, f"Acme handbook - {title}")  # running footer on every page
        if page == 0:
            pdf.setFont("Helvetica-Bold", 18)
            pdf.drawString(40, y, title)
            y -= 40
            for heading, body in sections:
                pdf.setFont("Helvetica-Bold", 14)
                pdf.drawString(40, y, heading)
                y -= 24
                pdf.setFont("Helvetica", 10)
                pdf.drawString(40, y, body)
                y -= 30
        pdf.showPage()
    pdf.save()
    return buffer.getvalue()


def make_docx(title: str, sections: list[tuple[str, str]]) -> bytes:
    document = docx.Document()
    document.add_heading(title, level=1)
    for heading, body in sections:
        document.add_heading(heading, level=2)
        document.add_paragraph(body)
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Level", "Budget"
    table.cell(1, 0).text, table.cell(1, 1).text = "Senior", "$2,000"
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def test_markdown_headings_become_breadcrumbs():
    parsed = parse_document(
        b"# Leave policy\n\nIntro.\n\n## Paid time off\n\n25 days a year.\n\n### Carry-over\n\nUp to 5 days.\n", "leave.md"
    )
    assert parsed.title == "Leave policy"
    assert [(b.headings, b.text) for b in parsed.blocks] == [
        ((), "Intro."),
        (("Paid time off",), "25 days a year."),
        (("Paid time off", "Carry-over"), "Up to 5 days."),
    ]


def test_markdown_code_fence_is_not_a_heading():
    parsed = parse_document(b"# T\n\n```\n# not a heading\n```\n", "x.md")
    assert parsed.blocks[0].headings == ()
    assert "# not a heading" in parsed.blocks[0].text


def test_html_skips_navigation_and_keeps_table_rows():
    html = (
        b"<html><head><title>Expenses</title><script>var x=1</script></head><body><nav>Home | About</nav>"
        b"<h1>Expenses</h1><h2>Travel</h2><p>Hotels up to <b>$250</b> a night.</p>"
        b"<table><tr><th>City</th><th>Cap</th></tr><tr><td>Boston</td><td>$300</td></tr></table></body></html>"
    )
    parsed = parse_document(html, "expenses.html")
    assert parsed.title == "Expenses"
    texts = [b.text for b in parsed.blocks]
    assert texts == ["Hotels up to $250 a night.", "City | Cap", "Boston | $300"]
    assert all(b.headings == ("Travel",) for b in parsed.blocks)


def test_pdf_headings_come_from_font_size_and_footers_are_dropped():
    data = make_pdf("Travel Policy", [("Flights", "Economy under six hours."), ("Hotels", "Up to 250 dollars.")])
    parsed = parse_document(data, "travel.pdf")
    assert parsed.title == "Travel Policy"
    assert [(b.headings, b.text) for b in parsed.blocks] == [
        (("Flights",), "Economy under six hours."),
        (("Hotels",), "Up to 250 dollars."),
    ]


def test_docx_heading_styles_and_tables():
    data = make_docx("Learning budget", [("Who is eligible", "Everyone after probation.")])
    parsed = parse_document(data, "budget.docx")
    assert parsed.title == "Learning budget"
    assert (("Who is eligible",), "Everyone after probation.") in [(b.headings, b.text) for b in parsed.blocks]
    assert (("Who is eligible",), "Senior | $2,000") in [(b.headings, b.text) for b in parsed.blocks]


@pytest.mark.parametrize("name", ["broken.pdf", "broken.docx"])
def test_corrupt_files_raise_a_clear_error(name):
    with pytest.raises(CorruptDocument, match="could not read"):
        parse_document(b"this is not really a document", name)


def test_binary_text_file_is_corrupt_and_unknown_suffix_is_unsupported():
    with pytest.raises(CorruptDocument, match="binary"):
        parse_document(b"\x00\x01\x02", "notes.txt")
    with pytest.raises(UnsupportedFormat, match=r"\.pptx"):
        parse_document(b"PK...", "deck.pptx")


def test_csv_rows_carry_their_header_and_quoted_fields_stay_whole():
    data = b'Office,Address,Wifi\r\nBerlin,"Torstr. 1, 10119 Berlin",nw-berlin\r\n\r\nLisbon,"Rua X, 2",nw-lisbon\r\n'
    parsed = parse_document(data, "offices.csv")
    assert parsed.title == "Offices"
    assert [(b.header, b.text) for b in parsed.blocks] == [
        ("| Office | Address | Wifi |", "| Berlin | Torstr. 1, 10119 Berlin | nw-berlin |"),
        ("| Office | Address | Wifi |", "| Lisbon | Rua X, 2 | nw-lisbon |"),
    ]


def test_xlsx_sheets_become_sections_of_rows():
    import io

    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.active.title = "Staff"
    workbook.active.append(["Name", "Team"])
    workbook.active.append(["Ann", "Ops"])
    rooms = workbook.create_sheet("Rooms")
    rooms.append(["Room", "Floor"])
    rooms.append(["Aurora", 3])
    buffer = io.BytesIO()
    workbook.save(buffer)
    parsed = parse_document(buffer.getvalue(), "directory.xlsx")
    assert [(b.headings, b.header, b.text) for b in parsed.blocks] == [
        (("Staff",), "| Name | Team |", "| Ann | Ops |"),
        (("Rooms",), "| Room | Floor |", "| Aurora | 3 |"),
    ]
