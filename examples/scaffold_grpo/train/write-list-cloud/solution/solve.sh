#!/bin/bash
echo cloud > /workspace/list.txt
