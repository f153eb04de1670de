"""Generate the PDF and DOCX documents of the held-out "Tidewater Public Utilities" knowledge base.

``examples/tidewater/`` is a second, held-out knowledge base (a municipal water and electric utility): ragbot's
thresholds are tuned on ``examples/handbook/`` and reported on this one (see docs/evaluation.md). As for the
handbook, the binary formats are generated from the source text kept below so they can be reviewed as text.

Usage (from the repository root)::

    .venv/bin/python examples/make_tidewater_binaries.py

The mini-markup (``# Title``, ``## Section``, ``- item``, ``1. item``, ``| a | b |``) and the deterministic writers
are those of ``make_handbook_binaries.py``; only the brand (company name on footers and properties, table header
colour, list spacing) differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_handbook_binaries import Brand, write_docx, write_pdf  # noqa: E402

TIDEWATER = Path(__file__).resolve().parent / "tidewater"
COMPANY = "Tidewater Public Utilities"
TIDEWATER_BRAND = Brand(footer=COMPANY, author=COMPANY, docx_author=COMPANY, subject="Staff reference",
                        creator="make_tidewater_binaries.py", header_colour="#e6f0ea")

DOCS: dict[str, str] = {}

DOCS["field-operations/lockout-tagout.pdf"] = """
# Lockout/Tagout (Hazardous Energy Control) Procedure

This procedure protects employees from the unexpected start-up or release of stored energy while servicing or maintaining equipment at TPU treatment plants, pump stations, lift stations and shops. It follows OSHA 29 CFR 1910.147. Electric transmission and distribution switching follows the separate Switching and Clearance Procedure, not this one.

## Who does what

- Authorized employees apply locks and tags. They have completed lockout/tagout training and the annual refresher.
- Affected employees work near the equipment or operate it; they are told before a lockout starts and when it ends, but never apply or remove locks.
- Each authorized employee has personal red locks with a single key, marked with their name. Nobody else has a copy of the key.

## Energy sources to control

Electrical, mechanical (rotating shafts, springs), hydraulic, pneumatic, chemical (chlorine, sodium hypochlorite lines), thermal, gravity (raised gates, suspended loads), and water under pressure in pipes and valves.

## The six steps

1. Prepare: review the equipment-specific lockout procedure and identify every energy source.
2. Notify all affected employees that the equipment will be shut down and locked out.
3. Shut down the equipment using its normal stopping controls.
4. Isolate every energy source (open the disconnect, close and chain the valves, block or lower raised parts) and apply your personal lock and a danger tag to each isolation point. On a group lockout, each worker puts a personal lock on the group lockbox.
5. Release or restrain stored energy: bleed pressure, drain lines, discharge capacitors, block springs.
6. Verify isolation: with everyone clear, try to start the equipment with the normal controls and test for voltage with a meter that you check on a known live source before and after. Return the controls to off.

## Removing locks

Only the person who applied a lock removes it. If that person has left the site and cannot be reached, the lock may be removed only by the supervisor, after making every reasonable effort to contact the employee, confirming the employee is not on site, and informing the employee before they return to work. The removal is recorded on the Lock Removal form and sent to Safety.

## Shift changes

At a shift change, the incoming authorized employee applies their lock before the outgoing employee removes theirs, so the equipment is never left unprotected.

## Contractors

Contractors use their own lockout program, which must be at least as protective as this one. The TPU project manager and the contractor exchange procedures before work begins, and TPU locks stay on TPU isolation points.

## Periodic inspection

A supervisor or Safety Specialist who is not involved in the lockout observes each authorized employee performing a lockout at least once a year. Violations of this procedure are serious safety violations and can lead to dismissal for a first offence.
"""

DOCS["field-operations/confined-space-entry.pdf"] = """
# Permit-Required Confined Space Entry

Manholes, wet wells, vaults, valve pits, clearwells, tanks and digesters are confined spaces: large enough to enter, with limited ways in and out, and not designed for continuous occupancy. Most TPU confined spaces are permit-required because they can hold a hazardous atmosphere (hydrogen sulfide, methane, low oxygen) or have engulfment hazards. This procedure follows OSHA 29 CFR 1910.146.

## Roles

- Entrant: the worker who enters. Trained, wearing a harness attached to a retrieval line.
- Attendant: stays outside at the entrance for the whole entry, keeps count of entrants, monitors conditions, and never enters to attempt a rescue.
- Entry supervisor: signs the permit, checks that all conditions are met, and ends the entry if conditions change. The entry supervisor may also be the attendant.

## The entry permit

Fill out the entry permit on the crew tablet before the entry. It lists the space, the purpose, the entrants and attendant, the hazards, the isolation measures, the atmospheric test results, the rescue plan and the communication method. A permit is valid for one shift, at most 12 hours, and is closed and filed when the work is done.

## Atmospheric testing

Test the atmosphere before anyone enters, from top to bottom (oxygen, then flammable gases, then toxic gases), with a calibrated four-gas monitor that was bump-tested that day. Keep monitoring continuously during the entry.

| Hazard | Acceptable entry condition |
|---|---|
| Oxygen | 19.5% to 23.5% |
| Flammable gas | Below 10% of the lower explosive limit (LEL) |
| Hydrogen sulfide (H2S) | Below 10 ppm |
| Carbon monoxide (CO) | Below 25 ppm |

If any reading is outside these limits, nobody enters. Ventilate with the forced-air blower for at least 10 minutes and retest. If the alarm sounds during the entry, everybody leaves immediately.

## Rescue

Non-entry rescue with the tripod and winch is the first choice: the attendant winches the entrant out without entering. When the space makes non-entry rescue impossible, the Tidewater Fire Department technical rescue team must be notified before the entry and confirm they are available. Call 911 for any rescue.

## Training

Entrants, attendants and entry supervisors complete confined space training before their first entry and a refresher every year, including a practice rescue from a representative space.

## Reclassification

A space can be reclassified as non-permit when all hazards are eliminated without ventilation (for example, a dry valve vault after isolation). The reclassification is documented on the permit and lasts only while the hazards remain eliminated.
"""

DOCS["operations/water-quality-monitoring.pdf"] = """
# Drinking Water Quality Monitoring

TPU supplies drinking water to about 180,000 people from the Cedar River intake and the Millbrook wellfield, treated at the Harbor Hill Water Treatment Plant. This summary of our monitoring plan is for operators, laboratory staff and anyone answering customer questions about water quality. The full plan is approved by the State Drinking Water Program.

## Routine sampling

| Parameter | Where | How often |
|---|---|---|
| Total coliform and E. coli | 120 distribution sample stations | 150 samples per month |
| Chlorine residual | With every coliform sample, plus plant effluent | Continuous at the plant; with each sample in the system |
| Turbidity | Filter effluent | Continuous, recorded every 15 minutes |
| Lead and copper | Homes on the tap sampling list | 60 homes every 6 months |
| Disinfection byproducts (TTHM, HAA5) | 8 locations | Quarterly |
| Fluoride | Plant effluent | Daily |
| PFAS | Plant effluent and each well | Quarterly |

## Targets

- Chlorine residual at least 0.2 mg/L everywhere in the distribution system, and no more than 4.0 mg/L.
- Filter effluent turbidity below 0.3 NTU in at least 95% of measurements each month; TPU's own goal is below 0.1 NTU.
- Fluoride 0.7 mg/L, as recommended by the US Public Health Service.
- Lead: the 90th percentile of tap samples below the action level of 15 parts per billion.

## When a sample is positive

If a routine sample tests positive for total coliform, the lab notifies the Water Quality Manager within 1 hour. Three repeat samples are taken within 24 hours: at the same tap and at taps upstream and downstream. An E. coli positive in a repeat sample triggers a boil water notice the same day, in coordination with the State.

## Lead service lines

TPU's lead service line inventory is public on the website. We replace lead service lines on both the utility and the customer side at no cost to the customer, about 1,200 a year. Customers who want their water tested for lead can request a free test kit from Customer Service.

## Customer water quality complaints

Taste, odour and discoloured water complaints are logged by Customer Service and sent to Water Quality. Discoloured water after hydrant flushing or a main break usually clears after running the cold tap for 5 to 10 minutes. A water quality technician calls back within 1 business day, or within 2 hours when the customer reports an illness.

## Annual report

The Consumer Confidence Report (water quality report) for the previous calendar year is published by July 1 on the website and mailed to every customer.
"""

DOCS["people/pension-and-retirement.pdf"] = """
# Retirement Benefits

Regular TPU employees are members of the Tidewater Municipal Employees' Retirement System (TMERS), a defined benefit pension plan, and can also save in the City's 457(b) deferred compensation plan. This overview does not replace the plan documents; where they differ, the plan documents apply.

## Pension contributions

- Employees contribute 7% of base pay to TMERS, taken before income tax.
- TPU contributes the amount set each year by the plan's actuary, currently 14.2% of pay.
- Membership begins on the first day of employment for regular full-time employees and for part-time employees working at least 1,000 hours a year.

## Vesting

You are vested after **5 years** of credited service. If you leave before you are vested, you can withdraw your own contributions with interest, but you receive no pension. If you leave after vesting, you can leave your contributions in the plan and receive a pension from your normal retirement age.

## The pension formula

Annual pension = 2.0% x years of credited service x final average salary.

Final average salary is the average of your highest 3 consecutive years of base pay. Overtime, standby pay and allowances are not included; shift differentials are.

For example, an employee with 25 years of service and a final average salary of $80,000 receives 2.0% x 25 x $80,000 = $40,000 a year.

## Retirement age

| Type of retirement | Requirement | Pension |
|---|---|---|
| Normal retirement | Age 62 with 5 years of service | Full formula |
| Rule of 85 | Age plus service equals 85 or more, minimum age 55 | Full formula |
| Early retirement | Age 55 with 10 years of service | Reduced by 5% for each year before 62 |
| Disability retirement | 5 years of service, unable to work | Formula based on service to date, minimum 25% of final average salary |

## Cost-of-living adjustment

Pensions in payment increase each January by the change in the consumer price index, up to 2% a year.

## 457(b) deferred compensation

The 457(b) plan is a voluntary savings plan run by the City, with pre-tax and Roth options. TPU matches 50% of what you contribute, up to 2% of your base pay. The match vests immediately. You can enrol, change your contribution or change your investments at any time on the plan website.

## Retiree health insurance

Employees who retire directly from TPU with at least 15 years of service can stay on the TPU medical plan until age 65. TPU pays 50% of the retiree-only premium with 15 to 19 years of service and 75% with 20 years or more.

## Planning to retire

Contact the TMERS office at least 6 months before your planned retirement date for a pension estimate and a retirement counselling session.
"""

DOCS["customer-service/lifeline-discount-program.docx"] = """
# Lifeline Discount Program

The Lifeline discount program lowers utility bills for income-qualified residential customers. It is funded by a small public-benefits charge on all TPU bills, as approved by the Utility Board. This guide is for CSRs and the Customer Assistance team who enrol customers.

## The discount

- 30% off the electric energy charge and the monthly electric customer charge.
- 20% off the water and wastewater base charges.
- No late payment charges while enrolled.
- Payment arrangements without a down payment.

## Who qualifies

The account holder lives at the service address, the account is residential, and total household income is at or below 200% of the federal poverty guidelines. Households that receive SNAP, Medicaid, SSI or LIHEAP benefits qualify automatically with proof of the benefit.

| Household size | Maximum gross annual income (2025) |
|---|---|
| 1 | $31,300 |
| 2 | $42,300 |
| 3 | $53,300 |
| 4 | $64,300 |
| 5 | $75,300 |
| Each additional person | add $11,000 |

## How to enrol

1. The customer applies online in the portal, by phone, or with a paper form at the Customer Service Center or the Community Action Agency.
2. They provide proof of income for all adults in the household (the last 30 days of pay stubs, a benefit letter, or the most recent tax return), or proof of a qualifying benefit.
3. Customer Assistance reviews the application within 10 business days. The discount starts with the next full billing period after approval and is not applied retroactively.

## Recertification

Customers recertify every 2 years. Customers who qualified through a benefit program recertify by showing a current benefit letter. A reminder is sent 60 days before the enrolment ends. Customers who do not recertify lose the discount at the end of the enrolment period.

## Tenants with master-metered service

Tenants in apartment buildings where the landlord holds the TPU account cannot receive the discount on the bill. They can apply instead for a yearly Lifeline credit of $180, paid as a check, by sending a copy of their lease and proof of income.

## Privacy

Income documents are used only to decide eligibility and are destroyed 90 days after the decision. CSRs must not mention a customer's Lifeline status to anyone other than the account holder.
"""

DOCS["operations/emergency-operations-plan.docx"] = """
# Emergency Operations Plan (Summary)

This is the staff summary of TPU's Emergency Operations Plan (EOP). The EOP sets out how TPU organises itself when an emergency is larger than normal operations can handle: a major storm, a regional blackout, a treatment plant failure, a cyber attack, an earthquake, or a contamination event. The full plan, including annexes for each hazard, is in the EOP binder in every control room.

## Activation levels

| Level | When | Emergency Operations Center (EOC) |
|---|---|---|
| Level 3 - Monitoring | A storm or event is forecast, or a minor incident could grow | Duty officer monitors; EOC not staffed |
| Level 2 - Partial activation | More than 10,000 customers out of service, or an outage expected to last more than 24 hours, or a boil water notice for more than 1,000 customers | EOC staffed during the day by section chiefs |
| Level 1 - Full activation | More than 50,000 customers out, loss of a treatment plant, or any event needing City-wide coordination | EOC staffed 24/7 with all positions |

The General Manager, or the Duty Officer when the General Manager cannot be reached, decides the activation level.

## EOC location

The primary EOC is room 210 at the Operations Center, 1 Pier Road. The alternate EOC is the training room at the Harbor Hill Water Treatment Plant. Both have backup power for at least 72 hours.

## Command structure

TPU uses the Incident Command System (ICS). The Incident Commander leads the response and is supported by:

- a Public Information Officer (Communications), the only person who speaks to the media for TPU during the emergency;
- a Safety Officer;
- a Liaison Officer to the City EOC, the Fire Department and the State;
- Operations, Planning, Logistics and Finance/Administration section chiefs.

## Employee responsibilities

- When an emergency is declared, all employees report as directed in their storm or emergency role (see Storm Season Readiness). Check in with your supervisor by phone or Teams within 2 hours of the declaration.
- If you cannot reach your work location, report to the nearest TPU facility.
- Keep a record of hours and tasks on the ICS 214 activity log; costs may be reimbursed by FEMA only with complete records.

## Training and exercises

Everyone with an EOC position completes the FEMA online courses IS-100 and IS-700 within 6 months of being assigned. TPU holds one full-scale exercise and two tabletop exercises each year.
"""

DOCS["people/leave-and-time-off.docx"] = """
# Leave and Time Off

This guide covers vacation, sick leave, bereavement and other paid leave at Tidewater Public Utilities. Holidays are listed in the Holiday Calendar. Represented employees should also check the Local 412 agreement.

## Vacation accrual

Regular full-time employees accrue vacation every pay period based on their years of continuous service:

| Years of service | Vacation per year | Maximum balance |
|---|---|---|
| Less than 5 years | 12 days (96 hours) | 192 hours |
| 5 to 9 years | 15 days (120 hours) | 240 hours |
| 10 to 19 years | 20 days (160 hours) | 320 hours |
| 20 years or more | 25 days (200 hours) | 400 hours |

Regular part-time employees accrue vacation in proportion to their scheduled hours; for example, an employee scheduled 20 hours a week accrues half the full-time amount. Temporary and seasonal employees do not accrue vacation.

Vacation can be used after 6 months of employment. Once you reach the maximum balance you stop accruing until you use some. Unused vacation up to the maximum is paid out when you leave TPU.

## Requesting vacation

Request vacation in Workday at least 2 weeks in advance for periods of 3 days or more. Vacation requests for the summer (June 15 to September 15) are granted by seniority if submitted by March 1; after that, first come, first served. During storm season, approved vacation may be cancelled when an emergency is declared, and TPU reimburses non-refundable costs you can document.

## Sick leave

- Full-time employees accrue 8 hours of sick leave per month (12 days a year); part-time employees accrue 1 hour for every 30 hours worked.
- Sick leave has no maximum balance. At retirement, unused sick leave is converted into pension service credit (one month of service for every 20 days).
- Sick leave can be used for your own illness or medical appointments, or to care for a family member.
- A doctor's note is required for absences of more than 3 consecutive scheduled workdays, or when there is a pattern of absences next to weekends or holidays.

## Other paid leave

- Bereavement: 5 days for an immediate family member (spouse or partner, child, parent, sibling, grandparent, grandchild, or the same relations of your spouse or partner); 1 day for another relative.
- Jury duty: full pay for the time you serve, less any juror fee you keep. Tell your supervisor as soon as you get the summons.
- Voting: up to 2 hours of paid time to vote on election day if your shift does not allow time before or after.
- Military leave: up to 15 working days per year of paid leave for training, then unpaid leave protected by USERRA.
- Blood donation: 2 hours of paid time, up to 4 times a year.

## Family and medical leave

Eligible employees can take up to 12 weeks of job-protected leave in a 12-month period under the Family and Medical Leave Act (FMLA) and the state's Paid Family Leave program. You may use accrued vacation and sick leave during FMLA leave. Contact HR Benefits at least 30 days before foreseeable leave.
"""


def main() -> None:
    for rel, text in DOCS.items():
        out = TIDEWATER / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        (write_pdf if rel.endswith(".pdf") else write_docx)(out, text, TIDEWATER_BRAND)
        print(f"wrote {out.relative_to(TIDEWATER.parent)}")


if __name__ == "__main__":
    main()
