# SPDX-License-Identifier: MIT
#
# vased.conf.5.awk: turns `vased --config=/dev/null --dump-config` (every setting of the
# daemon's settings table, its description, bounds and default) into the scdoc source of
# vased.conf(5), so that the manual page cannot drift from the table. The page's fixed text is
# here; every setting and the [arena NAME] description come from the dump. `make man` runs it.
#
# The dump: a header comment, "[vased]", then per setting a blank line, its description as
# "# " comment lines, "# (BOUNDS; default "D"[; runtime])" and "name = value" ("#name = value"
# for one left to its default, as every one is in this dump); then a
# "# ---- Further arenas ... ----" comment, its text and an indented example ("#   ...").

# Text taken from the dump: scdoc's markup characters are escaped.
function esc(s) {
    gsub(/\\/, "\\\\", s)
    gsub(/\*/, "\\*", s)
    gsub(/_/, "\\_", s)
    return s
}

BEGIN {
    print "vased.conf(5)"
    print ""
    print "# NAME"
    print ""
    print "vased.conf - configuration of vased, the vase KV-cache daemon"
    print ""
    print "# SYNOPSIS"
    print ""
    print "_/etc/vase/vased.conf_"
    print ""
    print "_/etc/vase/vased.conf.d/\\*.conf_"
    print ""
    print "# DESCRIPTION"
    print ""
    print "An INI file read by *vased*(8) at start and again on SIGHUP (*systemctl reload vased*)."
    print "Settings are *key = value* lines of the section *[vased]*; lines starting with *#* are"
    print "comments. Every key belongs to a section and is given once. An unknown section,"
    print "an unknown key, a key given twice or a value out of bounds is refused: vased does not"
    print "start, and a reload keeps the running configuration."
    print ""
    print "Every setting may also be given on vased's command line as *--name=value* (with *-* or"
    print "*\\_* in the name); the command line wins over the file. Settings marked _runtime_ are"
    print "re-read on SIGHUP and may be changed with *vasectl config set*; the others need a"
    print "restart. *vased --dump-config* prints the configuration in effect as a complete file;"
    print "the default file is that output."
    print ""
    print "After the main file vased reads the drop-ins of _vased.conf.d_ beside it (or of"
    print "*config\\_dir*): every file whose name ends in *.conf* and does not start with a dot, in"
    print "bytewise order, each in this format; a later file overrides an earlier one, the command"
    print "line overrides them all. *vasectl config set --persist* writes _90-vasectl.conf_ there. On"
    print "SIGHUP a key the files leave unchanged keeps the value set with *vasectl config set*;"
    print "a key they change takes their value. A main configuration that is no file"
    print "(*--config=/dev/null*, an empty configuration) has no drop-in directory unless"
    print "*config\\_dir* names one; *--persist* is then refused (ENOTSUP)."
    print ""
    print "vased reads only files it can trust: the main file, the drop-in directory and each"
    print "drop-in must belong to root or to vased's user, must not be writable by their group or"
    print "others (whatever the group), and must be regular files; a drop-in must not be a"
    print "symlink (the main file and the directory may be: what they name is checked). Anything"
    print "else, a FIFO included (never waited on), is refused with a message naming the path and"
    print "the reason: vased does not start, and a reload keeps the running configuration."
    print ""
    print "Limits come in two kinds. The *max\\_\\*\\_per\\_client* settings bound one session (one"
    print "engine process); the *max\\_\\*\\_per\\_uid* settings bound all the sessions of one uid"
    print "together, so that a uid gains nothing by opening more sessions. A refusal by a per-uid"
    print "cap has the errno of the per-client one (EUSERS for a session, EDQUOT otherwise). The"
    print "per-uid caps do not apply to root and to the daemon's own uid. The eviction plans of all"
    print "sessions are queued fairly per uid: uids take turns, then each uid's sessions."
    print ""
    print "# SETTINGS OF [vased]"
    print ""
}

/^\[vased\]$/ {
    section = "vased"
    next
}
/^# ---- Further arenas/ {
    section = "arenas"
    print "# FURTHER ARENAS: [arena NAME] SECTIONS"
    print ""
    next
}

section == "vased" && /^#?[a-z_]+ =/ {
    name = $1
    sub(/^#/, "", name)
    printf "*%s*\n", esc(name)
    printf "\t%s\n\n", esc(desc)
    printf "\t(%s)\n\n", esc(kind)
    desc = ""; kind = ""
    n++
    next
}
section == "vased" && /^# \(.*\)$/ {
    kind = substr($0, 4, length($0) - 4)
    next
}
section == "vased" && /^# / {
    desc = desc (desc == "" ? "" : " ") substr($0, 3)
    next
}
section == "arenas" && /^#   / {
    if (!example) {
        if (text != "")
            print esc(text) "\n"
        print "```"
        example = 1
    }
    print substr($0, 5)
    next
}
section == "arenas" && /^# / {
    text = text (text == "" ? "" : " ") substr($0, 3)
    next
}

END {
    if (n == 0 || !example) {
        print "vased.conf.5.awk: no settings or no arena example in the dump" > "/dev/stderr"
        exit 1
    }
    print "```"
    print ""
    print "# FILES"
    print ""
    print "_/etc/vase/vased.conf_"
    print "\tThe configuration read by the vased.service unit (*--config=*). Installed only"
    print "\twhen absent, so an edited copy survives *make install*; the Debian package marks it"
    print "\ta conffile."
    print ""
    print "# SEE ALSO"
    print ""
    print "*vased*(8), *vasectl*(1), *libvase*(3)"
}
